package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/broker/policy"
	examples "github.com/switchyard-llm/switchyard/deploy/examples"
	"github.com/switchyard-llm/switchyard/enginesim"
	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/owners"
	adapter "github.com/switchyard-llm/switchyard/replica-adapter"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table/kv"
)

// regionSite is one region's parts on its own NATS server: a simulated
// engine and an adapter per replica, and a gateway deciding in the region.
type regionSite struct {
	name    string
	natsURL string
	gw      *gateway.Gateway
	url     string
	reg     *prometheus.Registry // the gateway's metrics
	ctx     context.Context
	wg      *sync.WaitGroup
}

// startRegion runs region name's parts against the server at natsURL,
// stopped when the test ends.
func startRegion(t *testing.T, natsURL, name string, replicas ...string) *regionSite {
	t.Helper()
	ln := testkit.Listen(t) // closed after the parts stop: cleanups run last first
	ctx, cancel := context.WithCancel(context.Background())
	s := &regionSite{name: name, natsURL: natsURL, ctx: ctx, wg: &sync.WaitGroup{}, url: "http://" + ln.Addr().String(), reg: prometheus.NewRegistry()}
	t.Cleanup(func() { cancel(); s.wg.Wait() })
	for _, id := range replicas {
		s.addReplica(t, id)
	}
	g, err := gateway.New(s.conn(t, "gateway-"+name), gateway.Config{ID: "gw-" + name, Region: name, Registerer: s.reg})
	if err != nil {
		t.Fatal(err)
	}
	s.gw = g
	s.wg.Go(func() {
		if err := g.Serve(ctx, ln); err != nil && ctx.Err() == nil {
			t.Errorf("gateway %s: %v", name, err)
		}
	})
	return s
}

// conn is a connection of part what to the region's server.
func (s *regionSite) conn(t *testing.T, what string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.natsURL, nats.Name(what), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// addReplica runs a simulated engine and its adapter, replica id of the
// region.
func (s *regionSite) addReplica(t *testing.T, id string) {
	t.Helper()
	run := func(what string, f func(context.Context) error) {
		s.wg.Go(func() {
			if err := f(s.ctx); err != nil && s.ctx.Err() == nil {
				t.Errorf("%s: %v", what, err)
			}
		})
	}
	eng := enginesim.NewServer(enginesim.ServerConfig{Engine: enginesim.Config{Model: "llama-3-8b-instruct"}, Speed: 4})
	run("engine "+id, eng.Run)
	hs := httptest.NewServer(eng.Handler())
	t.Cleanup(hs.Close)
	a, err := adapter.New(s.conn(t, "adapter-"+id), adapter.Config{
		Replica: id, Model: "llama-3-8b-instruct", Version: "v1.0.0", Pool: "general", Region: s.name,
		Flavor: adapter.FlavorVLLM, EngineURL: hs.URL, HeartbeatEvery: 100 * time.Millisecond, ScrapeEvery: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	run("adapter "+id, a.Run)
}

// regionPair is a supercluster of two regions whose link a test cuts:
// natstest.Regions (in process, the link a relay gone silent) or nsRegions
// (a nats-server per region in a network namespace, the link set down).
type regionPair interface {
	URL(i int) string
	Cut()
	Heal()
	Linked() bool
	Unlinked() bool
}

// seedTwoRegions makes the owners and table buckets on the server at url
// and seeds the example table, regions a and b spilling to each other; it
// returns the table's bucket and its policy.
func seedTwoRegions(t *testing.T, url string) (jetstream.KeyValue, map[string]any) {
	t.Helper()
	ctx := context.Background()
	seed, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(seed.Close) // the bucket returned writes through it
	js, err := jetstream.New(seed)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := owners.Ensure(ctx, js, owners.DefaultBucket, 1); err != nil {
		t.Fatal(err)
	}
	bucket, err := kv.EnsureBucket(ctx, js, subjects.DefaultBucket, 1)
	if err != nil {
		t.Fatal(err)
	}
	flat := examples.Flat()
	var pol map[string]any
	if err := json.Unmarshal(flat["policy"], &pol); err != nil {
		t.Fatal(err)
	}
	pol["dead_after"], pol["stale_after"] = "1s", "500ms"
	pol["regions"] = map[string]any{"a": map[string]any{"spill": []string{"b"}}, "b": map[string]any{"spill": []string{"a"}}}
	flat["policy"] = jsonMarshal(pol)
	if _, err := kv.Seed(ctx, bucket, flat); err != nil {
		t.Fatal(err)
	}
	return bucket, pol
}

// TestRegionsKeepServingWhenTheLinkIsCut: two regions of a real NATS
// supercluster (a server per region, joined by gateways), the routing
// table's bucket in region a. With the link between them cut, each region
// serves its own clients from its own replicas on the table it holds
// (region b's copy is its deciders' last good one: the bucket is out of its
// reach), none lost; a table write made in a during the cut reaches b once
// the link heals, and both regions then hold the same table.
func TestRegionsKeepServingWhenTheLinkIsCut(t *testing.T) {
	var sc regionPair
	link := "a loopback relay gone silent"
	if os.Getenv("SWITCHYARD_SUPERCLUSTER") == "1" {
		needNamespacedRegions(t)
		sc, link = netnsRegions(t, "a", "b"), "a veth between two network namespaces set down"
	} else {
		sc = natstest.TwoRegions(t, "a", "b")
	}
	t.Logf("the link between the regions: %s", link)
	ctx := context.Background()
	// The buckets are made from region a, so JetStream places them there.
	bucket, pol := seedTwoRegions(t, sc.URL(0))
	seed, err := nats.Connect(sc.URL(0))
	if err != nil {
		t.Fatal(err)
	}
	defer seed.Close()
	js, err := jetstream.New(seed)
	if err != nil {
		t.Fatal(err)
	}
	// Region b's copy of the table, in b's cluster, made as an operator
	// does; a second run finds it; a bad region is refused.
	for range 2 {
		if out, errOut, code := sy(t, nil, "", "table", "copy", "--nats", sc.URL(1), "b"); code != 0 || !strings.Contains(out, "in cluster b") {
			t.Fatalf("switchyard table copy b: exit %d, %q %q", code, out, errOut)
		}
	}
	if _, errOut, code := sy(t, nil, "", "table", "copy", "--nats", sc.URL(1), "b.c"); code != 2 || !strings.Contains(errOut, "REGION") {
		t.Errorf("switchyard table copy b.c: exit %d, %q; want a usage error naming REGION", code, errOut)
	}
	copyB, err := js.Stream(ctx, "KV_"+subjects.TableCopy(subjects.DefaultBucket, "b"))
	if err != nil {
		t.Fatal(err)
	}

	a := startRegion(t, sc.URL(0), "a", "l8-a-0", "l8-a-1")
	b := startRegion(t, sc.URL(1), "b", "l8-b-0", "l8-b-1")
	regionOf := map[string]string{"l8-a-0": "a", "l8-a-1": "a", "l8-b-0": "b", "l8-b-1": "b"}
	explain := func(g *gateway.Gateway) policy.Decision {
		return g.Decider().Router().Explain(&policy.Request{Tenant: "default", Model: "chat-small", Endpoint: subjects.EndpointChat, PromptTokens: 10}, time.Now(), nil)
	}
	testkit.CheckFor(t, 30*time.Second, 20*time.Millisecond, testkit.Cond("each gateway to route in its region", func() bool {
		for _, s := range []*regionSite{a, b} {
			if s.gw.Table() == nil || len(s.gw.Table().Policy.Regions) != 2 {
				return false
			}
			if d := explain(s.gw); d.Err != nil || d.ReplicaRegion != s.name {
				return false
			}
		}
		return true
	}))
	// send counts where n requests to site s were served.
	send4 := func(s *regionSite, n int) regionRow {
		row := regionRow{codes: map[string]int{}}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				o := send(context.Background(), s.url, chatBody("chat-small", 2, i%2 == 0))
				mu.Lock()
				defer mu.Unlock()
				if row.count(o, regionOf[o.replica], s.name) {
					t.Errorf("request %d to %s lost: %v", i, s.name, o)
				}
			})
		}
		wg.Wait()
		return row
	}
	if ra, rb := send4(a, 20), send4(b, 20); ra.local != 20 || rb.local != 20 {
		t.Fatalf("linked: from a %v, from b %v; want every request served in its region", ra, rb)
	}
	// b's gateway reads its region's copy: its watch is the copy's consumer.
	testkit.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		info, err := copyB.Info(ctx)
		if err != nil || info.State.Consumers == 0 {
			return fmt.Errorf("no watch on region b's copy (%v)", err)
		}
		return nil
	})

	sc.Cut()
	cut := time.Now()
	testkit.CheckFor(t, 30*time.Second, 20*time.Millisecond, testkit.Cond("the servers to see the link down", sc.Unlinked))
	seen := time.Since(cut)
	// A table write in a, the primary, during the cut.
	pol["regions"] = map[string]any{"a": map[string]any{"spill": []string{"b"}, "penalty": "70ms"}, "b": map[string]any{"spill": []string{"a"}}}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = bucket.Put(wctx, "policy", jsonMarshal(pol))
	cancel()
	if err != nil {
		t.Errorf("a table write in the primary region during the cut: %v", err)
	}
	ra, rb := send4(a, 40), send4(b, 40)
	t.Logf("link cut (seen by the servers after %v): from a %v; from b %v", seen.Round(time.Millisecond), ra, rb)
	if ra.local != 40 || rb.local != 40 {
		t.Errorf("cut: from a %v, from b %v; want every request served in its own region", ra, rb)
	}
	if p := b.gw.Table().Policy.Regions["a"].Penalty; p != 0 {
		t.Errorf("region b read a table write it cannot reach (penalty %v)", p)
	}
	// Region b stays ready, and says it routes on its last good table.
	readyz := func(s *regionSite) (int, string) {
		resp, err := http.Get(s.url + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	testkit.CheckFor(t, 60*time.Second, 100*time.Millisecond, testkit.Cond("b's /readyz to say its table's bucket is out of reach", func() bool {
		code, body := readyz(b)
		return code == 200 && strings.Contains(body, "routing table: the last good one; its bucket out of reach")
	}))
	codeA, bodyA := readyz(a)
	t.Logf("b's /readyz said so %v after the cut; a's: %d %q", time.Since(cut).Round(time.Millisecond), codeA, bodyA)
	if ra, rb := send4(a, 10), send4(b, 10); ra.local != 10 || rb.local != 10 {
		t.Errorf("cut, later: from a %v, from b %v; want every request served in its own region", ra, rb)
	}
	// An adapter of b that starts during the cut cannot register (the
	// table's bucket is in a); it registers once the link heals.
	hb, err := b.conn(t, "heartbeats").SubscribeSync(subjects.New("").Heartbeat("l8-b-2"))
	if err != nil {
		t.Fatal(err)
	}
	b.addReplica(t, "l8-b-2")
	regionOf["l8-b-2"] = "b"
	// Running (its heartbeats are out), and a few scrapes, each of which
	// tries to register it.
	for range 3 {
		if _, err := hb.NextMsg(10 * time.Second); err != nil {
			t.Fatalf("no heartbeat of the adapter started during the cut: %v", err)
		}
	}
	if _, ok := b.gw.Table().Replicas["l8-b-2"]; ok {
		t.Errorf("a replica of b registered during the cut")
	}

	sc.Heal()
	testkit.CheckFor(t, 30*time.Second, 20*time.Millisecond, testkit.Cond("the link up again", sc.Linked))
	converged := testkit.CheckFor(t, 60*time.Second, 20*time.Millisecond, testkit.Cond("both regions to hold the same table", func() bool {
		ta, tb := a.gw.Table(), b.gw.Table()
		return ta != nil && tb != nil && maps.EqualFunc(ta.Raw, tb.Raw, func(x, y json.RawMessage) bool { return string(x) == string(y) }) &&
			time.Duration(tb.Policy.Regions["a"].Penalty) == 70*time.Millisecond
	}))
	registered := testkit.CheckFor(t, 60*time.Second, 20*time.Millisecond, testkit.Cond("the adapter started during the cut registered, in both regions' tables", func() bool {
		_, ina := a.gw.Table().Replicas["l8-b-2"]
		_, inb := b.gw.Table().Replicas["l8-b-2"]
		return ina && inb
	}))
	testkit.CheckFor(t, 30*time.Second, 100*time.Millisecond, testkit.Cond("neither /readyz to say the bucket is out of reach", func() bool {
		ca, ba := readyz(a)
		cb, bb := readyz(b)
		return ca == 200 && cb == 200 && !strings.Contains(ba, "out of reach") && !strings.Contains(bb, "out of reach")
	}))
	divergent := 0
	for k, v := range a.gw.Table().Raw {
		if string(b.gw.Table().Raw[k]) != string(v) {
			divergent++
		}
	}
	ra, rb = send4(a, 20), send4(b, 20)
	t.Logf("healed: the table converged %v after the heal, %d divergent keys; the adapter started during the cut registered %v after the heal; from a %v; from b %v",
		converged.Round(time.Millisecond), divergent, (converged + registered).Round(time.Millisecond), ra, rb)
	if ra.local != 20 || rb.local != 20 {
		t.Errorf("healed: from a %v, from b %v; want every request served in its region", ra, rb)
	}
}
