package test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// Recovery bounds of the production shape's faults: measured on a loaded
// 2-core machine (docs/reliability.md), with margin for a quiet CI one.
const (
	routingBound  = 60 * time.Second // routing normal again through both gateways
	writableBound = 60 * time.Second // the table writable after its leader is killed or frozen
	hangBound     = 90 * time.Second // a request longer than this is hung
)

// TestProductionShapeSurvivesLosingAnyProcess runs `make cluster`'s launcher
// (cmd/cluster -faults) under mixed load through both gateways and, one at a
// time with recovery in between, kills or stops each kind of process. It
// fails on any request lost or hung, or a recovery past its bound, and
// prints the per-fault table. `make test-cluster` runs it.
func TestProductionShapeSurvivesLosingAnyProcess(t *testing.T) {
	if os.Getenv("SWITCHYARD_CLUSTER_FAULTS") == "" {
		t.Skip("make test-cluster runs this (separate processes, minutes)")
	}
	c := startCluster(t)
	gateways := c.gateways
	op, js := c.operator()

	l := newClusterLoad(gateways)
	ctx, stopLoad := context.WithCancel(context.Background())
	var load sync.WaitGroup
	load.Go(func() { l.balance(ctx) })
	for w := range 6 {
		load.Go(func() { l.run(ctx, w) })
	}
	defer func() { stopLoad(); load.Wait() }()
	if _, ok, _ := l.normal(routingBound); !ok {
		t.Fatalf("routing not normal %v after the start", routingBound)
	}

	type row struct {
		fault             string
		failed, retried   int64
		routing, writable time.Duration
		note              string
		class             failureClass
		cuts              []faultSpan // when the fault cut or killed a part
	}
	var rows []row
	var cur *row
	// command carries out one action of the launcher, noting when one cuts
	// or kills a part (failures classified).
	command := func(cmd string) {
		t.Helper()
		from := time.Now()
		c.command(cmd)
		switch verb, _, _ := strings.Cut(cmd, " "); verb {
		case "kill", "stop", "cut": // a SIGTERM drains: it cuts nothing
			cur.cuts = append(cur.cuts, faultSpan{from, time.Now()})
		}
	}
	// step carries out one action of a fault and waits for routing to be
	// normal again; a fault's figure is its slowest step.
	step := func(c string) {
		t.Helper()
		command(c)
		d, ok, rec := l.normal(routingBound)
		if !ok {
			t.Errorf("%s: routing not normal within %v after %q", cur.fault, routingBound, c)
		}
		if d > recoverBound {
			t.Logf("%s: routing normal %v after %q: %v", cur.fault, d.Round(time.Millisecond), c, rec)
		}
		cur.routing = max(cur.routing, d.Round(time.Millisecond))
	}
	// fault runs one fault; onPath says whether a request's path went
	// through the part it cut or killed (nil: it cut none a request needs).
	fault := func(name string, onPath func(*sent) bool, inject func()) {
		rows = append(rows, row{fault: name})
		cur = &rows[len(rows)-1]
		from, total0 := time.Now(), l.total.Load()
		l.mark()
		inject()
		cur.failed, cur.retried = l.since()
		cur.class = l.classify(from, l.total.Load()-total0, cur.cuts, onPath)
		if codes := l.failures(from); codes != "" {
			cur.note = strings.TrimPrefix(cur.note+"; failed: "+codes, "; ")
		}
		cur.class.log(t, name)
	}

	writable := func(since time.Time) time.Duration {
		t.Helper()
		d, err := tableWritable(js, since, "aliases.after-failover")
		if err != nil {
			t.Errorf("%s: %v", cur.fault, err)
		}
		return d
	}
	fault("1. SIGKILL the NATS node leading llm-routing; restart it", anyPath, func() {
		s, err := js.Stream(context.Background(), "KV_"+subjects.DefaultBucket)
		if err != nil {
			t.Fatal(err)
		}
		leader := s.CachedInfo().Cluster.Leader
		cur.note = leader
		killed := time.Now()
		step("kill " + leader)
		cur.writable = writable(killed)
		step("start " + leader)
	})
	// brokerUp waits until broker id answers $SRV.PING: it is in the queue
	// group, as a rolling restart waits for before stopping the next.
	brokerUp := func(id string) {
		t.Helper()
		_, err := testkit.Poll(routingBound, 50*time.Millisecond, func() error {
			inbox := nats.NewInbox()
			sub, err := op.SubscribeSync(inbox)
			if err != nil {
				return err
			}
			defer sub.Unsubscribe()
			_ = op.PublishRequest("$SRV.PING."+subjects.BrokerService, inbox, nil)
			for {
				// Every broker answers; wait for the one restarted.
				m, err := sub.NextMsg(500 * time.Millisecond)
				if err != nil {
					return fmt.Errorf("%s did not answer a ping: %w", id, err)
				}
				var ping struct {
					Metadata map[string]string `json:"metadata"`
				}
				if json.Unmarshal(m.Data, &ping) == nil && ping.Metadata["broker"] == id {
					return nil
				}
			}
		})
		if err != nil {
			t.Errorf("%s not in the queue group %v after its start: %v", id, routingBound, err)
		}
	}
	// A broker is on no request's path once it has forwarded it: a
	// gateway sends a request it did not route again.
	fault("2. SIGKILL broker-1, restart it; SIGTERM broker-2, restart it", nil, func() {
		step("kill broker-1")
		step("start broker-1")
		brokerUp("broker-1")
		step("term broker-2")
		step("start broker-2")
		brokerUp("broker-2")
	})
	// A SIGTERM drains: the gateway answers what it had in flight.
	fault("3. SIGTERM gateway-1; restart it", nil, func() {
		at := time.Now()
		l.stopping.Store(1)
		command("term gateway-1")   // routing goes on through gateway-2
		time.Sleep(2 * time.Second) // its new connections meanwhile wait on the socket the launcher keeps
		step("start gateway-1")
		l.stopping.Store(0)
		ok, failed := l.inFlight(0, at)
		cur.note = fmt.Sprintf("in flight at gateway-1's SIGTERM: %d completed, %d failed explicitly", ok, failed)
	})
	// The kill cuts the answers of l8-gen-0; the SIGTERM drains l8-gen-1.
	fault("4. SIGKILL engine l8-gen-0 under streams, restart it; SIGTERM adapter l8-gen-1, restart it", func(r *sent) bool {
		return r.o.replica == "l8-gen-0"
	}, func() {
		step("kill engine-l8-gen-0")
		step("start engine-l8-gen-0")
		step("term adapter-l8-gen-1")
		step("start adapter-l8-gen-1")
	})
	fault("5. chat-large to the canary at 50 %; rolled back", nil, func() {
		kv, err := js.KeyValue(context.Background(), subjects.DefaultBucket)
		if err != nil {
			t.Fatal(err)
		}
		orig, err := kv.Get(context.Background(), "aliases.chat-large")
		if err != nil {
			t.Fatal(err)
		}
		edited := time.Now()
		l.canary.Store(0)
		if _, err := kv.Put(context.Background(), "aliases.chat-large", []byte(`{"targets":[{"model":"llama-3-70b-instruct","version":"v1.5.0","weight":50},{"model":"llama-3-70b-instruct","version":"v1.6.0","weight":50}],"fallbacks":["chat-small"]}`)); err != nil {
			t.Fatal(err)
		}
		_, _ = testkit.Poll(routingBound, 20*time.Millisecond, testkit.Cond("20 answers from the canary", func() bool { return l.canary.Load() >= 20 }))
		half := l.canary.Load()
		cur.routing = time.Since(edited).Round(time.Millisecond)
		if half < 20 {
			t.Errorf("the canary at 50 %%: only %d answers from v1.6.0 within %v", half, routingBound)
		}
		if _, err := kv.Put(context.Background(), "aliases.chat-large", orig.Value()); err != nil {
			t.Fatal(err)
		}
		d, ok, _ := l.normal(routingBound)
		if !ok {
			t.Errorf("routing not normal %v after the rollback", routingBound)
		}
		cur.routing = max(cur.routing, d.Round(time.Millisecond))
		cur.note = fmt.Sprintf("20 answers from the canary %v after the edit", cur.routing)
	})

	fault("6. SIGSTOP the NATS node leading llm-routing for 30 s; SIGCONT", anyPath, func() {
		s, err := js.Stream(context.Background(), "KV_"+subjects.DefaultBucket)
		if err != nil {
			t.Fatal(err)
		}
		leader := s.CachedInfo().Cluster.Leader
		on := gatewaysOn(strings.Split(c.printed["monitor"], ","), leader)
		cur.note = leader + " frozen (" + on + " on it): its connections stay open and carry nothing"
		frozen := time.Now()
		step("stop " + leader)
		cur.writable = writable(frozen)
		time.Sleep(time.Until(frozen.Add(30 * time.Second)))
		step("cont " + leader)
	})

	// Right after fault 6's frozen node, as a batch may meet one.
	fault("7. a 2,000-line batch: SIGKILL the NATS node leading its items and broker-1; restart them", anyPath, func() {
		cur.note = clusterBatchPhase(t, c, js, command)
	})

	stopLoad()
	load.Wait()
	total, ok, failed, lost, hung := l.totals()
	var b strings.Builder
	fmt.Fprintf(&b, "\n| fault | requests | failed explicitly | avoidable | sent to the other gateway | routing normal after (slowest step) | table writable after | |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		w := "—"
		if r.writable > 0 {
			w = r.writable.String()
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %v | %s | %s |\n", r.fault, r.class.requests, r.failed, r.class.avoidable, r.retried, r.routing, w, r.note)
	}
	for _, r := range rows {
		fmt.Fprintf(&b, "\n%s: %s", r.fault, r.class)
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "\n%d requests: %d ok, %d failed explicitly, %d lost, %d hung; %s\n", total, ok, failed, lost, hung, l.heldNote())
	t.Log(b.String())
	if lost > 0 || hung > 0 {
		for _, r := range l.bad() {
			t.Log(r)
		}
		t.Errorf("%d requests lost, %d hung", lost, hung)
	}
}

// clusterRun is `make cluster`'s launcher (cmd/cluster -faults) run by a
// test, ready: its gateways serve.
type clusterRun struct {
	t        *testing.T
	gateways []string          // public URLs
	admins   []string          // admin URLs (/metrics)
	printed  map[string]string // "NATS", "CA", "creds", "monitor" → the value printed
	dir      string            // the launcher's -dir: the parts' logs are in dir/logs
	stdin    io.WriteCloser
	lines    chan string
}

// startCluster builds and starts the launcher with args added, waits until
// it is ready and stops it when the test ends.
func startCluster(t *testing.T, args ...string) *clusterRun {
	t.Helper()
	launcher, err := goBuild(t.TempDir(), "cluster", "./cmd/cluster")
	if err != nil {
		t.Fatalf("build cmd/cluster: %v", err)
	}
	dir := t.TempDir()
	for i, a := range args {
		if a == "-dir" && i+1 < len(args) {
			dir = args[i+1] // the flag's last value is the launcher's
		}
	}
	cmd := exec.Command(launcher, append([]string{"-faults", "-dir", dir, "-root", repoRoot(),
		"-switchyard", binary(t), "-nats-server", natsServerBinary(t)}, args...)...)
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	c := &clusterRun{t: t, printed: map[string]string{}, dir: dir, stdin: stdin, lines: make(chan string, 64)}
	go func() { // ends with the launcher's stdout
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	for ready := false; !ready; {
		select {
		case l, ok := <-c.lines:
			if !ok {
				t.Fatal("the launcher ended before it was ready")
			}
			if u, ok := strings.CutPrefix(l, "gateway: "); ok {
				c.gateways = append(c.gateways, u)
			}
			if u, ok := strings.CutPrefix(l, "admin:"); ok && len(strings.Fields(u)) > 0 {
				c.admins = append(c.admins, strings.TrimSuffix(strings.Fields(u)[0], "/ui"))
			}
			if k, v, ok := strings.Cut(l, ":"); ok && len(strings.Fields(v)) > 0 {
				c.printed[k] = strings.Fields(v)[0]
			}
			ready = strings.HasPrefix(l, "Ctrl-C stops everything")
		case <-time.After(5 * time.Minute):
			t.Fatal("the cluster was not ready within 5 minutes")
		}
	}
	return c
}

// command has the launcher carry out one fault command.
func (c *clusterRun) command(cmd string) {
	c.t.Helper()
	fmt.Fprintln(c.stdin, cmd)
	select {
	case l := <-c.lines:
		if !strings.HasPrefix(l, "ok ") {
			c.t.Fatalf("%s: %s", cmd, l)
		}
	case <-time.After(30 * time.Second):
		c.t.Fatalf("%s: no answer", cmd)
	}
}

// connect connects to the NATS servers at urls (comma-separated) with the
// operator's creds, as natsconn connects; more options are added.
func (c *clusterRun) connect(urls string, opts ...nats.Option) *nats.Conn {
	c.t.Helper()
	nc, err := nats.Connect(urls, append([]nats.Option{nats.RootCAs(c.printed["CA"]), nats.UserCredentials(filepath.Join(c.printed["creds"], "operator.creds")), nats.MaxReconnects(-1),
		nats.PingInterval(5 * time.Second), nats.MaxPingsOutstanding(3)}, opts...)...)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(nc.Close)
	return nc
}

// operator is a connection to every server with the operator's creds.
func (c *clusterRun) operator() (*nats.Conn, jetstream.JetStream) {
	c.t.Helper()
	op := c.connect(c.printed["NATS"])
	js, _ := jetstream.New(op)
	return op, js
}

// tableWritable waits until the table takes a write of key, at most until
// writableBound after since, and returns how long after since that was.
func tableWritable(js jetstream.JetStream, since time.Time, key string) (time.Duration, error) {
	_, err := testkit.Poll(writableBound-time.Since(since), 50*time.Millisecond, func() error {
		wctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		kv, err := js.KeyValue(wctx, subjects.DefaultBucket)
		if err == nil {
			_, err = kv.Put(wctx, key, []byte(`{"targets":[{"model":"llama-3-8b-instruct","version":"v1.0.0","weight":100}]}`))
		}
		return err
	})
	if err != nil {
		return writableBound, fmt.Errorf("table not writable within %v: %w", writableBound, err)
	}
	return time.Since(since).Round(time.Millisecond), nil
}

// clusterLoad sends mixed requests through the gateways: tenants,
// conversations, long contexts, premium, streamed and not, through a load
// balancer (balance): a gateway whose /readyz fails is out of the rotation
// until it passes again, and a request a gateway cannot take (connection
// refused, or a 503 that says gateway.HdrRetryElsewhere, as Envoy's
// retriable-headers retries) goes to the other.
type clusterLoad struct {
	gateways                               []string
	total, ok, failed, lost, hung, retried atomic.Int64
	markFailed, markRetried                atomic.Int64
	canary                                 atomic.Int64   // answers from v1.6.0
	stopping                               atomic.Int64   // 1 + the index of the gateway being stopped, or 0
	code                                   bool           // every tenth request asks for `code`, served at the GPU site
	out                                    [2]atomic.Bool // the balancer took the gateway out of the rotation
	held                                   atomic.Int64   // requests held while no gateway was in the rotation
	heldLongest                            atomic.Int64   // the longest such hold, nanoseconds

	mu   sync.Mutex
	reqs []sent
}

// sent is one request as the client saw it.
type sent struct {
	gateway    int
	model      string
	start, end time.Time
	o          outcome
}

func newClusterLoad(g []string) *clusterLoad { return &clusterLoad{gateways: g} }

func (l *clusterLoad) run(ctx context.Context, w int) {
	long := strings.Repeat("the quick brown fox jumps over the lazy dog ", 1700) // > 16,000 tokens
	for i := 0; ctx.Err() == nil; i++ {
		g := (w + i) % len(l.gateways)
		key, model, content, conv := "", "auto", "Hello", ""
		switch i % 5 {
		case 1:
			key, model = "sk-acme-dev", "chat-large" // premium
		case 2:
			model, content = "chat-large", long // long context
		case 3:
			key, model, conv = "sk-teamx-dev", "chat-small", fmt.Sprintf("teamx-%d-%d", w, i%3) // LoRA
		case 4:
			model, conv = "chat-large", fmt.Sprintf("conv-%d-%d", w, i%11) // conversations
		}
		if l.code && i%10 == 9 {
			key, model, content, conv = "", "code", "write a function", ""
		}
		body := fmt.Sprintf(`{"model":%q,"stream":%v,"max_tokens":24,"messages":[{"role":"user","content":%q}]}`, model, i%2 == 0, content)
		var ok bool
		if g, ok = l.pick(ctx, g); !ok {
			return
		}
		start := time.Now()
		o, version := l.send(l.gateways[g], key, conv, body)
		if l.refused(g, o) || o.elsewhere {
			l.retried.Add(1)
			g = 1 - g
			o, version = l.send(l.gateways[g], key, conv, body)
		}
		l.total.Add(1)
		switch {
		case o.status == 200 && o.done:
			l.ok.Add(1)
			if version == "v1.6.0" {
				l.canary.Add(1)
			}
		case errors.Is(o.err, context.DeadlineExceeded):
			l.hung.Add(1)
		case o.explicit():
			l.failed.Add(1)
		default:
			l.lost.Add(1)
		}
		l.mu.Lock()
		l.reqs = append(l.reqs, sent{gateway: g, model: model, start: start, end: time.Now(), o: o})
		l.mu.Unlock()
	}
}

// balanceEvery is how often the load balancer asks each gateway's /readyz.
const balanceEvery = 250 * time.Millisecond

// balance is the load balancer's health check until ctx ends: every
// balanceEvery it asks each gateway's /readyz, and one that fails (or does
// not answer within 2 s) is out of the rotation until it passes again.
// Requests sent to a gateway before it is taken out count as any others.
func (l *clusterLoad) balance(ctx context.Context) {
	var wg sync.WaitGroup
	for g, url := range l.gateways {
		wg.Go(func() {
			t := time.NewTicker(balanceEvery)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				l.out[g].Store(!ready(ctx, url))
			}
		})
	}
	wg.Wait()
}

// ready reports whether gateway's /readyz answers 200 within 2 s.
func ready(ctx context.Context, gateway string) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, gateway+"/readyz", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode == http.StatusOK
}

// pick is the gateway the balancer sends the next request to: g when it is
// in the rotation, else the other; with neither in it the request waits
// until one is back (ok false: ctx ended first).
func (l *clusterLoad) pick(ctx context.Context, g int) (_ int, ok bool) {
	var since time.Time
	for {
		for _, c := range []int{g, 1 - g} {
			if !l.out[c].Load() {
				if !since.IsZero() {
					l.held.Add(1)
					d := int64(time.Since(since))
					for {
						old := l.heldLongest.Load()
						if d <= old || l.heldLongest.CompareAndSwap(old, d) {
							break
						}
					}
				}
				return c, true
			}
		}
		if since.IsZero() {
			since = time.Now()
		}
		select {
		case <-ctx.Done():
			return g, false
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// heldNote says how many requests the balancer held with no gateway in
// its rotation, and the longest hold.
func (l *clusterLoad) heldNote() string {
	return fmt.Sprintf("%d held by the load balancer while neither gateway passed /readyz (the longest %v)",
		l.held.Load(), time.Duration(l.heldLongest.Load()).Round(100*time.Millisecond))
}

// refused reports whether gateway g turned the connection away before it
// read the request: refused, an idle connection it closed as it shut down,
// or, from the gateway being stopped, a kept-alive connection that failed
// before any answer (reset, broken pipe: the request raced its close; a
// gateway that read a request answers it before it exits). A load balancer sends such a request to
// another gateway.
func (l *clusterLoad) refused(g int, o outcome) bool {
	if o.err == nil || o.status != 0 {
		return false
	}
	e := o.err.Error()
	if strings.Contains(e, "connection refused") || strings.Contains(e, "server closed idle connection") {
		return true
	}
	return l.stopping.Load() == int64(g+1) && !errors.Is(o.err, context.DeadlineExceeded)
}

func (l *clusterLoad) send(gw, key, conv, body string) (outcome, string) {
	ctx, cancel := context.WithTimeout(context.Background(), hangBound)
	defer cancel()
	start := time.Now()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gw+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if conv != "" {
		req.Header.Set("X-Conversation-Id", conv)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return outcome{err: err, took: time.Since(start)}, ""
	}
	defer resp.Body.Close()
	o := readAnswer(resp)
	o.took = time.Since(start)
	o.elsewhere = resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get(gateway.HdrRetryElsewhere) == "1"
	return o, resp.Header.Get("X-Switchyard-Version")
}

// inFlight counts how the requests through gateway g that were under way
// at t ended.
func (l *clusterLoad) inFlight(g int, t time.Time) (ok, failed int) {
	ok, failed, _ = l.underWay(t, func(r *sent) bool { return r.gateway == g })
	return ok, failed
}

// underWay counts how the requests that match and were under way at t
// ended, and how long after t the last of them ended.
func (l *clusterLoad) underWay(t time.Time, match func(*sent) bool) (ok, failed int, last time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range l.reqs {
		r := &l.reqs[i]
		if !match(r) || r.start.After(t) || r.end.Before(t) {
			continue
		}
		if r.o.status == 200 && r.o.done {
			ok++
		} else {
			failed++
		}
		last = max(last, r.end.Sub(t))
	}
	return ok, failed, last
}

// failures counts the requests that ended after from without an answer,
// by error code.
func (l *clusterLoad) failures(from time.Time) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := map[string]int{}
	for _, r := range l.reqs {
		if r.end.Before(from) || (r.o.status == 200 && r.o.done) {
			continue
		}
		code := r.o.code
		switch {
		case r.o.err != nil:
			code = "transport error"
		case code == "":
			code = "no code"
		}
		n[fmt.Sprintf("%d %s", r.o.status, code)]++
	}
	keys := slices.Sorted(maps.Keys(n))
	for i, k := range keys {
		keys[i] = fmt.Sprintf("%s ×%d", k, n[k])
	}
	return strings.Join(keys, ", ")
}

// Failures a better router could not have avoided are a closed list
// (docs/reliability.md, "Failures classified"): the request was in flight
// through the part the fault cut or killed at that instant — its gateway,
// its gateway's NATS server, the adapter or engine serving it (when its
// answer could not resume) — and its failure says that path was cut. The
// other clause, no replica of its model reachable from any NATS server,
// does not arise in these faults: every model keeps a reachable replica or
// a fallback. Every other explicit failure is avoidable.

// pathCut reports whether a failure says the request's own path was cut:
// its gateway's link to NATS (router_unavailable), or its replica's link
// or engine (upstream_error, upstream_timeout). (A connection closed under
// a request is not an explicit failure: the test counts it lost.)
func pathCut(o outcome) bool {
	switch o.code {
	case subjects.CodeRouterUnavailable, subjects.CodeUpstreamError, subjects.CodeUpstreamTimeout:
		return true
	}
	return false
}

// failureClass is one fault's requests and explicit failures, the
// avoidable ones apart.
type failureClass struct {
	requests, failed, avoidable int64
	// seen describes the first avoidable failures: when each request
	// started and ended against the fault's first cut, its gateway, model
	// and error, for the log.
	seen []string
}

// String is the reports' line: "avoidable failures: N of M requests (P%)".
func (c failureClass) String() string {
	p := 0.0
	if c.requests > 0 {
		p = 100 * float64(c.avoidable) / float64(c.requests)
	}
	return fmt.Sprintf("avoidable failures: %d of %d requests (%.2f%%)", c.avoidable, c.requests, p)
}

// log writes the fault's line and its first avoidable failures.
func (c failureClass) log(t *testing.T, fault string) {
	t.Helper()
	t.Logf("%s: %s", fault, c)
	for _, f := range c.seen {
		t.Logf("%s: avoidable: %s", fault, f)
	}
}

// faultSpan is when the launcher carried out a command that cut or killed a
// part: the fault came into force at an instant within it, which one the
// test cannot tell, so a request under way at any time within it may have
// been in flight at the fault.
type faultSpan struct{ from, to time.Time }

// classify classifies the explicit failures of the requests that ended
// after from, out of requests: one is unavoidable when the request was
// under way within one of the spans cuts (when the fault cut or killed a
// part), onPath says that part was on its path (nil: the fault cut no
// part a request's path needs), and its failure says its path was cut.
func (l *clusterLoad) classify(from time.Time, requests int64, cuts []faultSpan, onPath func(*sent) bool) failureClass {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := failureClass{requests: requests}
	for i := range l.reqs {
		r := &l.reqs[i]
		if r.end.Before(from) || (r.o.status == 200 && r.o.done) || !r.o.explicit() {
			continue
		}
		c.failed++
		unavoidable := false
		if onPath != nil && pathCut(r.o) && onPath(r) {
			for _, at := range cuts {
				if !r.start.After(at.to) && r.end.After(at.from) {
					unavoidable = true
					break
				}
			}
		}
		if !unavoidable {
			c.avoidable++
			if len(c.seen) < 10 {
				at := from
				if len(cuts) > 0 {
					at = cuts[0].to
				}
				c.seen = append(c.seen, fmt.Sprintf("gateway %d %s started %+v, ended %+v after the first cut: %d %s %s",
					r.gateway+1, r.model, r.start.Sub(at).Round(time.Millisecond), r.end.Sub(at).Round(time.Millisecond), r.o.status, r.o.code, r.o.msg))
			}
		}
	}
	return c
}

// anyPath is onPath for a fault on a NATS server: which server a request's
// gateway and adapter used is not known here, so its failure's code says
// whether its path went through the one cut.
func anyPath(*sent) bool { return true }

// bad lists the requests lost or hung.
func (l *clusterLoad) bad() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.reqs {
		if !r.o.explicit() {
			out = append(out, fmt.Sprintf("gateway %d at %s: %v", r.gateway+1, r.start.Format("15:04:05.000"), r.o))
		}
	}
	return out
}

// mark starts a fault's counts.
func (l *clusterLoad) mark() {
	l.markFailed.Store(l.failed.Load() + l.lost.Load() + l.hung.Load())
	l.markRetried.Store(l.retried.Load())
}

// since returns the explicit failures and the requests sent to the other
// gateway since mark.
func (l *clusterLoad) since() (failed, retried int64) {
	return l.failed.Load() + l.lost.Load() + l.hung.Load() - l.markFailed.Load(), l.retried.Load() - l.markRetried.Load()
}

// probeEvery is how often normal sends each gateway a new probe while it
// has not answered one, with at most maxProbes under way at a gateway (a
// gateway waiting for its NATS link holds them, and they would all arrive
// at once when it is back).
const (
	probeEvery = 100 * time.Millisecond
	maxProbes  = 10
)

// normal waits until routing is normal again: from now, every probeEvery
// each gateway that has not yet answered one gets a new short request
// (`auto`, 4 tokens, not streamed, each on its own, so one that waits does
// not hold back the next), and routing is normal once both answered one
// that started after now. It returns how long after now the second
// gateway's answer came, and what each gateway's probes met on the way
// (logged when recovery was slow). The load's own requests are not the
// measure: they run in step, and a long-context one started just after a
// fault would count its seconds of prefill as the time to recover.
func (l *clusterLoad) normal(bound time.Duration) (time.Duration, bool, recovery) {
	from := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	var probes sync.WaitGroup
	defer func() { cancel(); probes.Wait() }()
	var mu sync.Mutex
	rec := make(recovery, len(l.gateways))
	open := make([]int, len(l.gateways)) // probes under way
	all := make(chan struct{})
	tick := time.NewTicker(probeEvery)
	defer tick.Stop()
	for {
		for g, gw := range l.gateways {
			mu.Lock()
			skip := rec[g].answered != 0 || open[g] >= maxProbes
			if !skip {
				open[g]++
			}
			mu.Unlock()
			if skip {
				continue
			}
			probes.Go(func() {
				start := time.Since(from)
				o := probe(ctx, gw)
				mu.Lock()
				defer mu.Unlock()
				open[g]--
				r := &rec[g]
				if !o.done || o.status != 200 {
					if ctx.Err() == nil {
						r.note(time.Since(from), o)
					}
					return
				}
				if r.answered != 0 {
					return
				}
				r.answered, r.started = time.Since(from), start
				if !slices.ContainsFunc(rec, func(p gatewayProbes) bool { return p.answered == 0 }) {
					close(all)
				}
			})
		}
		select {
		case <-all:
			mu.Lock()
			defer mu.Unlock()
			return rec.slowest(), true, slices.Clone(rec)
		case <-ctx.Done():
			mu.Lock()
			defer mu.Unlock()
			return bound, false, slices.Clone(rec)
		case <-tick.C:
		}
	}
}

// recoverBound is how soon after a fault routing should be normal again
// (the failures issue's bound); a slower recovery logs what the probes met.
const recoverBound = 3 * time.Second

// recovery is what normal's probes met, per gateway.
type recovery []gatewayProbes

// gatewayProbes is one gateway's probes: when the first answer came (and when
// that probe started), and how the others ended, by outcome.
type gatewayProbes struct {
	answered, started time.Duration
	failed            map[string]int
	firstFail         time.Duration // when the first failed probe ended
	lastFail          time.Duration // when the last one ended
}

func (r *gatewayProbes) note(end time.Duration, o outcome) {
	if r.failed == nil {
		r.failed = map[string]int{}
		r.firstFail = end
	}
	why := fmt.Sprintf("%d %s", o.status, o.code)
	if o.err != nil {
		why = "error: " + o.err.Error()
	}
	r.failed[why]++
	r.lastFail = end
}

func (rec recovery) slowest() time.Duration {
	var d time.Duration
	for _, r := range rec {
		d = max(d, r.answered)
	}
	return d
}

// String says, per gateway, when its first answer came and what its probes
// met before.
func (rec recovery) String() string {
	var b strings.Builder
	for g, r := range rec {
		if g > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "gateway-%d answered %v (probe started %v)", g+1, r.answered.Round(time.Millisecond), r.started.Round(time.Millisecond))
		if len(r.failed) > 0 {
			fmt.Fprintf(&b, ", failed probes ended %v–%v:", r.firstFail.Round(time.Millisecond), r.lastFail.Round(time.Millisecond))
			for _, why := range slices.Sorted(maps.Keys(r.failed)) {
				fmt.Fprintf(&b, " %s ×%d", why, r.failed[why])
			}
		}
	}
	return b.String()
}

// probe sends gateway a short chat request and reads its answer before
// ctx ends.
func probe(ctx context.Context, gateway string) outcome {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gateway+"/v1/chat/completions",
		strings.NewReader(`{"model":"auto","max_tokens":4,"messages":[{"role":"user","content":"Hello"}]}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return outcome{err: err}
	}
	defer resp.Body.Close()
	return readAnswer(resp)
}

func (l *clusterLoad) totals() (total, ok, failed, lost, hung int64) {
	return l.total.Load(), l.ok.Load(), l.failed.Load(), l.lost.Load(), l.hung.Load()
}
