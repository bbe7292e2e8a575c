package test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/subjects"
)

// Recovery bounds of the production shape's faults: measured on a loaded
// 2-core machine (docs/reliability.md), with margin for a quiet CI one.
const (
	routingBound  = 60 * time.Second // routing normal again through both gateways
	writableBound = 30 * time.Second // the table writable after its leader is killed
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
	root := repoRoot()
	bin := t.TempDir()
	for _, b := range [][]string{{"switchyard", "./cmd/switchyard"}, {"cluster", "./cmd/cluster"}} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(bin, b[0]), b[1])
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v: %s", b[0], err, out)
		}
	}
	dir := t.TempDir()
	cmd := exec.Command(filepath.Join(bin, "cluster"), "-faults", "-dir", dir, "-root", root,
		"-switchyard", filepath.Join(bin, "switchyard"), "-nats-server", natsServerBinary(t))
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
	lines := make(chan string, 64)
	go func() { // ends with the launcher's stdout
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var gateways []string
	printed := map[string]string{}
	for ready := false; !ready; {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("the launcher ended before it was ready")
			}
			if u, ok := strings.CutPrefix(l, "gateway: "); ok {
				gateways = append(gateways, u)
			}
			if k, v, ok := strings.Cut(l, ":"); ok && len(strings.Fields(v)) > 0 {
				printed[k] = strings.Fields(v)[0]
			}
			ready = strings.HasPrefix(l, "Ctrl-C stops everything")
		case <-time.After(5 * time.Minute):
			t.Fatal("the cluster was not ready within 5 minutes")
		}
	}
	command := func(c string) {
		t.Helper()
		fmt.Fprintln(stdin, c)
		select {
		case l := <-lines:
			if !strings.HasPrefix(l, "ok ") {
				t.Fatalf("%s: %s", c, l)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: no answer", c)
		}
	}
	op, err := nats.Connect(printed["NATS"], nats.RootCAs(printed["CA"]), nats.UserCredentials(filepath.Join(printed["creds"], "operator.creds")), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	js, _ := jetstream.New(op)

	l := newClusterLoad(gateways)
	ctx, stopLoad := context.WithCancel(context.Background())
	var load sync.WaitGroup
	for w := range 6 {
		load.Go(func() { l.run(ctx, w) })
	}
	defer func() { stopLoad(); load.Wait() }()
	if d, ok := l.normal(routingBound); !ok {
		t.Fatalf("routing not normal %v after start", d)
	}

	type row struct {
		fault             string
		failed, retried   int64
		routing, writable time.Duration
	}
	var rows []row
	fault := func(name string, inject func() time.Duration) {
		l.mark()
		writable := inject()
		d, ok := l.normal(routingBound)
		if !ok {
			t.Errorf("%s: routing not normal within %v", name, routingBound)
		}
		failed, retried := l.since()
		rows = append(rows, row{name, failed, retried, d.Round(time.Millisecond), writable})
	}

	fault("SIGKILL the llm-routing leader, restart it", func() time.Duration {
		s, err := js.Stream(context.Background(), "KV_"+subjects.DefaultBucket)
		if err != nil {
			t.Fatal(err)
		}
		leader := s.CachedInfo().Cluster.Leader
		killed := time.Now()
		command("kill " + leader)
		var w time.Duration
		for {
			wctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			kv, err := js.KeyValue(wctx, subjects.DefaultBucket)
			if err == nil {
				_, err = kv.Put(wctx, "aliases.after-failover", []byte(`{"targets":[{"model":"llama-3-8b-instruct","version":"v1.0.0","weight":100}]}`))
			}
			cancel()
			if err == nil {
				w = time.Since(killed)
				break
			}
			if time.Since(killed) > writableBound {
				t.Errorf("table not writable %v after its leader was killed: %v", writableBound, err)
				break
			}
		}
		time.Sleep(3 * time.Second)
		command("start " + leader)
		return w
	})
	fault("SIGKILL broker-1, SIGTERM broker-2, restart both", func() time.Duration {
		command("kill broker-1")
		command("start broker-1")
		time.Sleep(3 * time.Second)
		command("term broker-2")
		command("start broker-2")
		return 0
	})
	fault("SIGTERM gateway-1, restart it", func() time.Duration {
		command("term gateway-1")
		time.Sleep(3 * time.Second)
		command("start gateway-1")
		return 0
	})
	fault("SIGKILL engine l8-gen-0 under streams, SIGTERM adapter l8-gen-1", func() time.Duration {
		command("kill engine-l8-gen-0")
		time.Sleep(2 * time.Second)
		command("start engine-l8-gen-0")
		command("term adapter-l8-gen-1")
		command("start adapter-l8-gen-1")
		return 0
	})

	stopLoad()
	load.Wait()
	total, ok, failed, lost, hung := l.totals()
	var b strings.Builder
	fmt.Fprintf(&b, "\n| fault | failed explicitly | retried on the other gateway | routing normal after | table writable after |\n|---|---|---|---|---|\n")
	for _, r := range rows {
		w := "—"
		if r.writable > 0 {
			w = r.writable.Round(time.Millisecond).String()
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %v | %s |\n", r.fault, r.failed, r.retried, r.routing, w)
	}
	fmt.Fprintf(&b, "\n%d requests: %d ok, %d failed explicitly, %d lost, %d hung\n", total, ok, failed, lost, hung)
	t.Log(b.String())
	if lost > 0 || hung > 0 {
		t.Errorf("%d requests lost, %d hung", lost, hung)
	}
}

// clusterLoad sends mixed requests through the gateways: tenants,
// conversations, long contexts, premium, streamed and not. A request a
// gateway cannot take (connection refused) goes to the other, as a load
// balancer would.
type clusterLoad struct {
	gateways                               []string
	total, ok, failed, lost, hung, retried atomic.Int64
	markFailed, markRetried                atomic.Int64
	lastOK                                 [2]atomic.Int64 // unix nanos of each gateway's last success
}

func newClusterLoad(g []string) *clusterLoad { return &clusterLoad{gateways: g} }

func (l *clusterLoad) run(ctx context.Context, w int) {
	long := strings.Repeat("the quick brown fox jumps over the lazy dog ", 400)
	for i := 0; ctx.Err() == nil; i++ {
		g := (w + i) % len(l.gateways)
		key, model, content := "", "auto", fmt.Sprintf("conversation %d turn %d", w, i)
		switch i % 4 {
		case 1:
			key, model = "sk-acme-dev", "chat-large" // premium
		case 2:
			content = long // long context
		}
		stream := i%2 == 0
		body := fmt.Sprintf(`{"model":%q,"stream":%v,"max_tokens":16,"messages":[{"role":"user","content":%q}]}`, model, stream, content)
		o := l.send(l.gateways[g], key, body)
		if o.err != nil && !errors.Is(o.err, context.DeadlineExceeded) && o.status == 0 {
			l.retried.Add(1)
			g = 1 - g
			o = l.send(l.gateways[g], key, body)
		}
		l.total.Add(1)
		switch {
		case o.status == 200 && o.done:
			l.ok.Add(1)
			l.lastOK[g].Store(time.Now().UnixNano())
		case errors.Is(o.err, context.DeadlineExceeded):
			l.hung.Add(1)
		case o.explicit():
			l.failed.Add(1)
		default:
			l.lost.Add(1)
		}
	}
}

func (l *clusterLoad) send(gateway, key, body string) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), hangBound)
	defer cancel()
	start := time.Now()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gateway+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return outcome{err: err, took: time.Since(start)}
	}
	defer resp.Body.Close()
	o := readAnswer(resp)
	_, _ = io.Copy(io.Discard, resp.Body)
	o.took = time.Since(start)
	return o
}

// mark starts a fault's counts.
func (l *clusterLoad) mark() {
	l.markFailed.Store(l.failed.Load() + l.lost.Load() + l.hung.Load())
	l.markRetried.Store(l.retried.Load())
}

// since returns the explicit failures and retries since mark.
func (l *clusterLoad) since() (failed, retried int64) {
	return l.failed.Load() + l.lost.Load() + l.hung.Load() - l.markFailed.Load(), l.retried.Load() - l.markRetried.Load()
}

// normal waits until both gateways answered successfully after now, and
// returns how long that took.
func (l *clusterLoad) normal(bound time.Duration) (time.Duration, bool) {
	from := time.Now()
	for time.Since(from) < bound {
		if l.lastOK[0].Load() > from.UnixNano() && l.lastOK[1].Load() > from.UnixNano() {
			return time.Since(from), true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return bound, false
}

func (l *clusterLoad) totals() (total, ok, failed, lost, hung int64) {
	return l.total.Load(), l.ok.Load(), l.failed.Load(), l.lost.Load(), l.hung.Load()
}
