package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// inFlightBound is how long after a gateway's cut the requests it had in
// flight may take to end: its connection's pings give the link up after
// three missed, 5 s apart (docs/reliability.md), plus a period.
const inFlightBound = 30 * time.Second

// partitionPrefix names the namespaces, bridges and links of the run.
const partitionPrefix = "sypart"

// TestProductionShapeSurvivesPartitions runs `make cluster`'s launcher with
// each NATS server, the GPU site, each broker and each gateway in a network
// namespace of its own (cmd/cluster -netns) under the mixed load of
// TestProductionShapeSurvivesLosingAnyProcess, and cuts one link at a time
// by setting it down: a NATS server from its peers and clients, the GPU
// site's leaf link, a gateway from every NATS server, a broker. It fails on
// any request lost or hung, a recovery past its bound, a gateway slow to
// turn unready or answering slowly while unready, and any key of the table
// that differs between the servers after healing. `make test-partition`
// runs it, as root; it writes its figures into docs/reliability.md
// (SWITCHYARD_PARTITION_DOC).
func TestProductionShapeSurvivesPartitions(t *testing.T) {
	if os.Getenv("SWITCHYARD_PARTITIONS") == "" {
		t.Skip("make test-partition runs this (root, network namespaces, minutes)")
	}
	if why := namespacesUnavailable(); why != "" {
		if os.Getenv("PARTITION_SKIP_OK") == "1" {
			t.Skip("no partitions made: " + why)
		}
		t.Fatalf("no partitions can be made: %s (PARTITION_SKIP_OK=1 accepts a run that partitions nothing)", why)
	}
	began := time.Now()
	// One gateway decides in its own process, the other through the
	// brokers: every scenario runs both paths, and the broker cut has
	// requests that a broker must route.
	args := []string{"-netns", partitionPrefix, "-gateway-decide", "mixed"}
	if dir := os.Getenv("SWITCHYARD_PARTITION_DIR"); dir != "" {
		args = append(args, "-dir", dir) // kept: the parts' logs
	}
	// Registered first, so it runs last: after the launcher's own cleanup,
	// in case the launcher was killed before it could remove them.
	t.Cleanup(func() { cleanPartitions(t) })
	c := startCluster(t, args...)
	_, js := c.operator()
	nodes := strings.Split(c.printed["NATS"], ",")
	monitors := strings.Split(c.printed["monitor"], ",")
	if len(nodes) != 3 || len(monitors) != 3 || len(c.admins) != 2 {
		t.Fatalf("NATS %v, monitors %v, admin listeners %v", nodes, monitors, c.admins)
	}

	l := newClusterLoad(c.gateways)
	l.code = true
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
	resumed := func() float64 {
		n := 0.0
		for _, a := range c.admins {
			n += testkit.Sum(testkit.Remote(a+"/metrics"), "switchyard_gateway_resumes_total", map[string]string{"outcome": "completed"})
		}
		return n
	}

	var rows []partitionRow
	var cur *partitionRow
	// normal waits for routing through both gateways after an action; a
	// scenario's figure is its slowest.
	normal := func(after string) {
		t.Helper()
		from := time.Now()
		d, ok, rec := l.normal(routingBound)
		if !ok {
			t.Errorf("%s: routing not normal within %v after %s", cur.name, routingBound, after)
			for _, r := range l.slowSince(from, 5*time.Second) {
				t.Log(r)
			}
		}
		t.Logf("%s: routing normal %v after %s", cur.name, d.Round(time.Millisecond), after)
		if d > recoverBound {
			t.Logf("%s: %v", cur.name, rec)
		}

		cur.routing = max(cur.routing, d.Round(time.Millisecond))
	}
	var cuts []faultSpan // when the scenario cut a link (failures classified)
	command := func(cmd string) {
		t.Helper()
		from := time.Now()
		c.command(cmd)
		if strings.HasPrefix(cmd, "cut ") {
			cuts = append(cuts, faultSpan{from, time.Now()})
		}
	}
	// scenario runs one partition; onPath says whether a request's path
	// went through the part it cut (nil: none a request needs).
	scenario := func(name string, onPath func(*sent) bool, run func()) {
		rows = append(rows, partitionRow{name: name})
		cur = &rows[len(rows)-1]
		from := time.Now()
		cuts = nil
		total0, failed0, lost0, hung0 := l.total.Load(), l.failed.Load(), l.lost.Load(), l.hung.Load()
		res0 := resumed()
		run()
		// What was in flight during the scenario has ended once routing
		// is normal; the counts include it.
		cur.requests, cur.failed = l.total.Load()-total0, l.failed.Load()-failed0
		cur.lost, cur.hung = l.lost.Load()-lost0, l.hung.Load()-hung0
		cur.resumed = resumed() - res0
		cur.codes = l.failures(from)
		cur.class = l.classify(from, cur.requests, cuts, onPath)
		cur.class.log(t, name)
		for code, msg := range l.failureSamples(from) {
			t.Logf("%s: %s: %s", name, code, msg)
		}
	}
	// hold keeps a cut in place until at least d after it was made, so
	// that the connections through it are given up (three missed pings).
	hold := func(cutAt time.Time, d time.Duration) { time.Sleep(time.Until(cutAt.Add(d))) }

	scenario("one NATS server (the table's leader) cut from the other two and its clients", anyPath, func() {
		s, err := js.Stream(context.Background(), "KV_"+subjects.DefaultBucket)
		if err != nil {
			t.Fatal(err)
		}
		leader := s.CachedInfo().Cluster.Leader
		i := slices.Index([]string{"nats-1", "nats-2", "nats-3"}, leader)
		if i < 0 {
			t.Fatalf("leader %q", leader)
		}
		cur.note = leader
		onIt := gatewaysOn(monitors, leader)
		// The table is written through the two others.
		majority := c.connect(strings.Join(slices.Delete(slices.Clone(nodes), i, i+1), ","), nats.IgnoreDiscoveredServers())
		mjs, _ := jetstream.New(majority)
		cutAt := time.Now()
		command("cut " + leader)
		var writing sync.WaitGroup
		writing.Go(func() {
			d, err := tableWritable(mjs, cutAt, "aliases.during-partition")
			if err != nil {
				t.Errorf("%s: %v", cur.name, err)
			}
			cur.writable = d
		})
		normal("the cut")
		writing.Wait()
		hold(cutAt, 30*time.Second)
		healed := time.Now()
		command("heal " + leader)
		normal("the heal")
		// Every key the same on the three servers, the cut one included.
		var diff []string
		_, err = testkit.Poll(routingBound, 500*time.Millisecond, func() error {
			diff = divergentKeys(t, c, nodes, monitors)
			if len(diff) > 0 {
				return fmt.Errorf("%d keys differ: %v", len(diff), diff)
			}
			return nil
		})
		if err != nil {
			t.Errorf("%s: the servers' copies of %s still differ %v after the heal: %v", cur.name, subjects.DefaultBucket, routingBound, err)
		}
		cur.divergent, cur.compared = len(diff), true
		cur.note += fmt.Sprintf(" cut for %v, %s on it; every key at the same revision and value on the three servers %v after the heal",
			healed.Sub(cutAt).Round(time.Second), onIt, time.Since(healed).Round(100*time.Millisecond))
	})

	scenario("the GPU site's leaf link cut", func(r *sent) bool { return r.model == "code" || r.o.replica == siteReplica }, func() {
		streams := siteStreams(t, c.gateways, 3)
		cutAt := time.Now()
		command("cut " + siteName)
		ended := make([]outcome, len(streams))
		var reading sync.WaitGroup
		for i, s := range streams {
			reading.Go(func() { ended[i] = s.rest(cutAt) })
		}
		// coder-gen-0 leaves routing: a `code` request is answered by
		// the fallback without trying it (faster than the accept timeout).
		left, err := testkit.Poll(routingBound, 200*time.Millisecond, func() error {
			o, replica := codeRequest(c.gateways[1])
			if o.status == 200 && replica != siteReplica && o.took < time.Second {
				return nil
			}
			return fmt.Errorf("code answered by %q after %v: %v", replica, o.took, o)
		})
		if err != nil {
			t.Errorf("%s: %s still in routing %v after the cut: %v", cur.name, siteReplica, routingBound, err)
		}
		if deadAfter := 15 * time.Second; left > deadAfter+5*time.Second {
			t.Errorf("%s: %s left routing %v after the cut; dead_after is %v (heartbeats every second)", cur.name, siteReplica, left.Round(time.Millisecond), deadAfter)
		}
		normal("the cut")
		hold(cutAt, 30*time.Second)
		command("heal " + siteName)
		back, err := testkit.Poll(routingBound, 200*time.Millisecond, func() error {
			if o, replica := codeRequest(c.gateways[0]); o.status != 200 || replica != siteReplica {
				return fmt.Errorf("code answered by %q: %v", replica, o)
			}
			return nil
		})
		if err != nil {
			t.Errorf("%s: %s not back in routing %v after the heal: %v", cur.name, siteReplica, routingBound, err)
		}
		cur.routing = max(cur.routing, back.Round(time.Millisecond))
		normal("the heal")
		reading.Wait()
		var whole, failedStreams int
		var last time.Duration
		for i, o := range ended {
			last = max(last, o.took)
			switch {
			case o.done && o.code == "":
				whole++
			case o.explicit():
				failedStreams++
				cur.failed++
			default:
				cur.lost++
				t.Errorf("%s: stream %d under way at the site at the cut: %v", cur.name, i, o)
			}
		}
		ok, failed, _ := l.underWay(cutAt, func(r *sent) bool { return r.model == "code" })
		cur.note = fmt.Sprintf("%s out of routing %v after the cut, back %v after the heal; %d streams under way there at the cut: %d ended whole, %d ended explicitly, the last %v after the cut; the load's `code` requests in flight at the cut: %d answered, %d failed explicitly",
			siteReplica, left.Round(100*time.Millisecond), back.Round(100*time.Millisecond), len(streams), whole, failedStreams, last.Round(100*time.Millisecond), ok, failed)
	})

	scenario("gateway-1 cut from every NATS server", func(r *sent) bool { return r.gateway == 0 }, func() {
		gw := c.gateways[0]
		cutAt := time.Now()
		command("cut gateway-1")
		unready, err := testkit.Poll(5*time.Second, 50*time.Millisecond, func() error {
			if s, _ := readyz(gw); s == 200 {
				return errors.New("/readyz still 200")
			}
			return nil
		})
		if err != nil {
			t.Errorf("%s: /readyz still ready 5 s after the cut", cur.name)
		}
		// While unready, a new request is told so at once.
		var slowest time.Duration
		for range 10 {
			if s, _ := readyz(gw); s == 200 {
				break
			}
			start := time.Now()
			status, h, b := postNow(gw, `{"model":"chat-small","messages":[{"role":"user","content":"hi"}],"max_tokens":4}`)
			d := time.Since(start)
			slowest = max(slowest, d)
			if status != 503 || !bytes.Contains(b, []byte(subjects.CodeRouterUnavailable)) || h.Get("Retry-After") == "" || d >= time.Second {
				t.Errorf("%s: a request while unready: %d Retry-After %q after %v: %s; want 503 router_unavailable with Retry-After at once",
					cur.name, status, h.Get("Retry-After"), d.Round(time.Millisecond), b)
			}
		}
		hold(cutAt, 25*time.Second)
		command("heal gateway-1")
		healed := time.Now()
		if _, err := testkit.Poll(routingBound, 100*time.Millisecond, func() error {
			if s, b := readyz(gw); s != 200 {
				return errors.New(string(b))
			}
			return nil
		}); err != nil {
			t.Errorf("%s: /readyz not ready %v after the heal: %v", cur.name, routingBound, err)
		}
		readyAgain := time.Since(healed)
		normal("the heal")
		ok, failed, last := l.underWay(cutAt, func(r *sent) bool { return r.gateway == 0 })
		if last > inFlightBound {
			t.Errorf("%s: a request in flight at the cut ended %v after it; the connection's pings give it up within %v", cur.name, last.Round(time.Millisecond), inFlightBound)
		}
		cur.note = fmt.Sprintf("/readyz unready %v after the cut, ready again %v after the heal; new requests while unready: 503 within %v; in flight at the cut: %d answered, %d failed explicitly, the last ended %v after the cut",
			unready.Round(time.Millisecond), readyAgain.Round(100*time.Millisecond), slowest.Round(time.Millisecond), ok, failed, last.Round(100*time.Millisecond))
	})

	// A broker is on no request's path once it has forwarded it: a
	// gateway sends a request it did not route again.
	scenario("broker-1 cut", nil, func() {
		gwCounter := func(name string) float64 {
			n := 0.0
			for _, a := range c.admins {
				n += testkit.Sum(testkit.Remote(a+"/metrics"), name, nil)
			}
			return n
		}
		resends0, late0 := gwCounter("switchyard_gateway_resends_total"), gwCounter("switchyard_gateway_late_routes_cancelled_total")
		cutAt := time.Now()
		command("cut broker-1")
		normal("the cut")
		hold(cutAt, 30*time.Second)
		command("heal broker-1")
		normal("the heal")
		// NATS hands the cut broker requests until the servers give it
		// up; a gateway that hears no routed notice within 250 ms sends
		// the request again, and the other broker takes it. None may wait
		// for the accept timeout and end 504.
		n, last := l.unrouted(cutAt)
		resends := gwCounter("switchyard_gateway_resends_total") - resends0
		if resends == 0 {
			t.Errorf("%s: no request was sent again: no gateway's request reached the cut broker, so the cut tested nothing", cur.name)
		}
		if n > 0 {
			t.Errorf("%s: %d requests went unrouted (504 after the accept timeouts, every copy at the cut broker), the last sent %v after the cut; want none",
				cur.name, n, last.Round(time.Millisecond))
		}
		cur.note = fmt.Sprintf("requests sent again to the queue group after 250 ms without a routed notice: %v; copies routed late and cancelled: %v; requests every copy of which went to the cut broker (504): %d",
			resends, gwCounter("switchyard_gateway_late_routes_cancelled_total")-late0, n)
	})

	stopLoad()
	load.Wait()
	total, ok, failed, lost, hung := l.totals()
	summary := fmt.Sprintf("%d requests: %d ok, %d failed explicitly, %d lost, %d hung; %s", total, ok, failed, lost, hung, l.heldNote())
	table := partitionTable(rows, summary)
	t.Log("\n" + table)
	if lost > 0 || hung > 0 {
		for _, r := range l.bad() {
			t.Log(r)
		}
		t.Errorf("%d requests lost, %d hung", lost, hung)
	}
	if doc := os.Getenv("SWITCHYARD_PARTITION_DOC"); doc != "" && !t.Failed() {
		load1 := "?"
		if b, err := os.ReadFile("/proc/loadavg"); err == nil {
			load1 = strings.Join(strings.Fields(string(b))[:3], " ")
		}
		run := fmt.Sprintf("Run of %s, %v from the launcher's start (%d cores, load average %s at the end):\n\n%s",
			time.Now().UTC().Format("2006-01-02 15:04 MST"), time.Since(began).Round(time.Second), runtime.NumCPU(), load1, table)
		if err := writePartitionRun(doc, run); err != nil {
			t.Errorf("writing %s: %v", doc, err)
		}
	}
}

const siteName, siteReplica = "gpu-site-1", "coder-gen-0"

// namespacesUnavailable says why no network namespace can be made here, or
// "" when one can.
func namespacesUnavailable() string {
	if runtime.GOOS != "linux" {
		return "network namespaces are Linux's"
	}
	if os.Geteuid() != 0 {
		return "not root"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "no ip command (iproute2)"
	}
	probe := partitionPrefix + "-probe"
	if out, err := exec.Command("ip", "netns", "add", probe).CombinedOutput(); err != nil {
		return fmt.Sprintf("ip netns add: %v: %s", err, bytes.TrimSpace(out))
	}
	_ = exec.Command("ip", "netns", "del", probe).Run()
	return ""
}

// cleanPartitions removes what the launcher would have, had it been killed.
func cleanPartitions(t *testing.T) {
	launcher, err := goBuild(t.TempDir(), "cluster", "./cmd/cluster")
	if err == nil {
		var out []byte
		if out, err = exec.Command(launcher, "-netns", partitionPrefix, "-netns-clean").CombinedOutput(); err != nil {
			err = fmt.Errorf("%v: %s", err, out)
		}
	}
	if err != nil {
		t.Errorf("cleaning the namespaces: %v", err)
	}
}

// partitionRow is one scenario's figures.
type partitionRow struct {
	name                         string
	requests, lost, hung, failed int64
	resumed                      float64
	routing, writable            time.Duration
	divergent                    int
	compared                     bool // the servers' copies of the table were compared
	codes, note                  string
	class                        failureClass
}

func partitionTable(rows []partitionRow, summary string) string {
	var b strings.Builder
	b.WriteString("| partition | requests | lost | hung | failed explicitly | avoidable | resumed | routing normal after | table writable after | divergent keys after healing | |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		w, d := "—", "—"
		if r.writable > 0 {
			w = r.writable.String()
		}
		if r.compared {
			d = fmt.Sprint(r.divergent)
		}
		failed := fmt.Sprint(r.failed)
		if r.codes != "" {
			failed += ": " + r.codes
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %s | %d | %.0f | %v | %s | %s | %s |\n", r.name, r.requests, r.lost, r.hung, failed, r.class.avoidable, r.resumed, r.routing, w, d, r.note)
	}
	b.WriteString("\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "%s: %s  \n", r.name, r.class)
	}
	fmt.Fprintf(&b, "\n%s\n", summary)
	return b.String()
}

// Markers of the runs' figures in docs/reliability.md; a run puts its own
// first and keeps the two before it.
const (
	partitionsStart = "<!-- partitions:start -->"
	partitionsEnd   = "<!-- partitions:end -->"
	partitionsRun   = "<!-- partitions:run -->"
)

func writePartitionRun(path, run string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	doc := string(b)
	i, j := strings.Index(doc, partitionsStart), strings.Index(doc, partitionsEnd)
	if i < 0 || j < i {
		return fmt.Errorf("no %s … %s in the file", partitionsStart, partitionsEnd)
	}
	runs := []string{strings.TrimSpace(run)}
	for _, r := range strings.Split(doc[i+len(partitionsStart):j], partitionsRun) {
		if r = strings.TrimSpace(r); r != "" && len(runs) < 3 {
			runs = append(runs, r)
		}
	}
	section := partitionsStart + "\n" + strings.Join(runs, "\n\n"+partitionsRun+"\n\n") + "\n" + partitionsEnd
	return os.WriteFile(path, []byte(doc[:i]+section+doc[j+len(partitionsEnd):]), 0o644)
}

// codeRequest asks gateway for a short `code` answer (the GPU site's model;
// chat-large is its fallback) and returns it with the serving replica.
func codeRequest(gateway string) (outcome, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	o := send(ctx, gateway, `{"model":"code","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
	return o, o.replica
}

func readyz(gateway string) (int, []byte) {
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(gateway + "/readyz")
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func postNow(gateway, body string) (int, http.Header, []byte) {
	c := http.Client{Timeout: hangBound}
	resp, err := c.Post(gateway+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, nil, []byte(err.Error())
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// divergentKeys reads the table's stream on each server itself: its state
// from the server's own /jsz, and each key's last revision and value with
// a direct get over a connection to that server alone (a server's own
// replica answers its clients' direct gets). It returns the keys (or
// "stream state") that differ between the servers.
func divergentKeys(t *testing.T, c *clusterRun, nodes, monitors []string) []string {
	t.Helper()
	stream := "KV_" + subjects.DefaultBucket
	type entry struct {
		rev   uint64
		value string
	}
	var states []string
	views := make([]map[string]entry, len(nodes))
	var keys []string
	for i, url := range nodes {
		var jsz struct {
			Accounts []struct {
				Streams []struct {
					Name  string `json:"name"`
					State struct {
						Msgs  uint64 `json:"messages"`
						First uint64 `json:"first_seq"`
						Last  uint64 `json:"last_seq"`
						Subj  uint64 `json:"num_subjects"`
					} `json:"state"`
				} `json:"stream_detail"`
			} `json:"account_details"`
		}
		state := "no stream"
		if getJSON(monitors[i]+"/jsz?accounts=true&streams=true", &jsz) {
			for _, a := range jsz.Accounts {
				for _, s := range a.Streams {
					if s.Name == stream {
						state = fmt.Sprintf("%+v", s.State)
					}
				}
			}
		}
		states = append(states, state)
		nc, err := nats.Connect(url, nats.RootCAs(c.printed["CA"]), nats.UserCredentials(c.printed["creds"]+"/operator.creds"),
			nats.IgnoreDiscoveredServers(), nats.NoReconnect())
		if err != nil {
			return []string{fmt.Sprintf("%s: %v", url, err)}
		}
		js, _ := jetstream.New(nc)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		s, err := js.Stream(ctx, stream)
		if err == nil && keys == nil {
			var kv jetstream.KeyValue
			if kv, err = js.KeyValue(ctx, subjects.DefaultBucket); err == nil {
				var kl jetstream.KeyLister
				if kl, err = kv.ListKeys(ctx); err == nil {
					for k := range kl.Keys() {
						keys = append(keys, k)
					}
				}
			}
		}
		views[i] = map[string]entry{}
		for _, k := range keys {
			if err != nil {
				break
			}
			var m *jetstream.RawStreamMsg
			if m, err = s.GetLastMsgForSubject(ctx, "$KV."+subjects.DefaultBucket+"."+k); err == nil {
				views[i][k] = entry{m.Sequence, string(m.Data)}
			}
		}
		cancel()
		nc.Close()
		if err != nil {
			return []string{fmt.Sprintf("%s: %v", url, err)}
		}
	}
	var diff []string
	if states[0] != states[1] || states[0] != states[2] {
		diff = append(diff, fmt.Sprintf("stream state %v", states))
	}
	for _, k := range keys {
		if views[0][k] != views[1][k] || views[0][k] != views[2][k] {
			diff = append(diff, k)
		}
	}
	return diff
}

func getJSON(url string, v any) bool {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	return resp.StatusCode == 200 && json.NewDecoder(resp.Body).Decode(v) == nil
}

// unrouted counts the requests started after from that no broker routed
// (504 upstream_timeout, "no broker routed …"), and how long after from
// the last of them started.
func (l *clusterLoad) unrouted(from time.Time) (n int, last time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.reqs {
		if r.start.After(from) && r.o.status == 504 && strings.Contains(r.o.msg, "no broker routed") {
			n++
			last = max(last, r.start.Sub(from))
		}
	}
	return n, last
}

// failureSamples is one message of each error code of the requests that
// ended after from without an answer.
func (l *clusterLoad) failureSamples(from time.Time) map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := map[string]string{}
	for _, r := range l.reqs {
		if !r.end.Before(from) && !(r.o.status == 200 && r.o.done) {
			m[fmt.Sprintf("%d %s", r.o.status, r.o.code)] = r.o.msg
		}
	}
	return m
}

// siteStream is a `code` stream served at the GPU site, its first chunk
// read.
type siteStream struct {
	resp  *http.Response
	br    *bufio.Reader
	start time.Time
}

// siteStreams opens n long `code` streams served by the GPU site's replica.
func siteStreams(t *testing.T, gateways []string, n int) []*siteStream {
	t.Helper()
	var out []*siteStream
	for i := 0; len(out) < n && i < 30; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), hangBound)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gateways[i%2]+"/v1/chat/completions",
			strings.NewReader(`{"model":"code","stream":true,"max_tokens":4000,"messages":[{"role":"user","content":"write a long program"}]}`))
		req.Header.Set("Content-Type", "application/json")
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			continue
		}
		br := bufio.NewReader(resp.Body)
		if line, err := br.ReadString('\n'); resp.StatusCode != 200 || resp.Header.Get("X-Switchyard-Replica") != siteReplica || err != nil || !strings.HasPrefix(line, "data:") {
			resp.Body.Close()
			cancel()
			continue
		}
		t.Cleanup(cancel)
		out = append(out, &siteStream{resp: resp, br: br, start: start})
	}
	if len(out) < n {
		t.Fatalf("only %d of %d streams landed on %s", len(out), n, siteReplica)
	}
	return out
}

// rest reads the stream to its end; took is how long after cut it ended.
func (s *siteStream) rest(cut time.Time) outcome {
	defer s.resp.Body.Close()
	o := outcome{status: s.resp.StatusCode, replica: siteReplica}
	o.done, o.code, o.msg, o.err = readSSEMessage(s.br)
	o.took = time.Since(cut)
	return o
}

// slowSince lists the requests under way at from or started after it that
// took longer than d, or have not ended.
func (l *clusterLoad) slowSince(from time.Time, d time.Duration) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.reqs {
		if !r.end.Before(from) && r.end.Sub(r.start) > d {
			out = append(out, fmt.Sprintf("gateway %d %s at %s: %v", r.gateway+1, r.model, r.start.Format("15:04:05.000"), r.o))
		}
	}
	return out
}

// gatewaysOn says how many gateways are connected to node (nats-1 …
// nats-3, whose monitoring endpoints are monitors in that order): "no
// gateway", "1 gateway", "2 gateways". A cut of a server a gateway is on
// is the slower to recover from.
func gatewaysOn(monitors []string, node string) string {
	var connz struct {
		Connections []struct {
			Name string `json:"name"`
		} `json:"connections"`
	}
	i := slices.Index([]string{"nats-1", "nats-2", "nats-3"}, node)
	if i < 0 || i >= len(monitors) || !getJSON(monitors[i]+"/connz?limit=1024", &connz) {
		return "gateways unknown"
	}
	n := 0
	for _, c := range connz.Connections {
		if c.Name == "switchyard-gateway" {
			n++
		}
	}
	switch n {
	case 0:
		return "no gateway"
	case 1:
		return "1 gateway"
	}
	return fmt.Sprintf("%d gateways", n)
}
