package test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// Region a: l8-gen-0 and l8-gen-1, with a KV cache of 64 blocks (1024
// tokens) and a slow decode, so that one long prompt saturates each; region
// b: l8-gen-2 and l8-gen-3, as the dev stack runs them.
var regionOfReplica = map[string]string{"l8-gen-0": "a", "l8-gen-1": "a", "l8-gen-2": "b", "l8-gen-3": "b"}

// regionGateway runs a gateway deciding in region on the stack's bus.
func regionGateway(t *testing.T, st *devstack.Stack, region string) (*gateway.Gateway, string) {
	t.Helper()
	return gatewayOnStack(t, st, gateway.Config{ID: "gw-" + region, Region: region})
}

// putJSON rewrites key of the routing table with the fields of set on top
// of its current value.
func putJSON(t *testing.T, kv jetstream.KeyValue, key string, set map[string]any) {
	t.Helper()
	v := map[string]any{}
	if e, err := kv.Get(context.Background(), key); err == nil {
		if err := json.Unmarshal(e.Value(), &v); err != nil {
			t.Fatal(err)
		}
	}
	for k, x := range set {
		if x == nil {
			delete(v, k)
		} else {
			v[k] = x
		}
	}
	if _, err := kv.Put(context.Background(), key, jsonMarshal(v)); err != nil {
		t.Fatal(err)
	}
}

// regionRow is one scenario's count, as docs/reliability.md's table under
// "Regions" reports it.
type regionRow struct {
	requests, local, spilled, failed, avoidable, lost int
	codes                                             map[string]int
}

// count adds o, served in region served (from regionOf) to a client of
// region home; it reports whether o was lost (neither served nor failed
// explicitly).
func (r *regionRow) count(o outcome, served, home string) (lost bool) {
	r.requests++
	switch {
	case o.done && served == home:
		r.local++
	case o.done:
		r.spilled++
	case o.explicit():
		r.failed++
		if !residencyRefusal(o) {
			r.avoidable++
		}
		r.codes[o.code+": "+o.msg]++
	default:
		r.lost++
		return true
	}
	return false
}

func (r regionRow) String() string {
	return fmt.Sprintf("%d requests: %d served locally, %d spilled, %d failed explicitly (%d avoidable) %v, %d lost",
		r.requests, r.local, r.spilled, r.failed, r.avoidable, r.codes, r.lost)
}

// residencyRefusal reports whether a failure is the table's residency rule
// refusing a request whose tenant's regions have no replica for it: the
// one failure of these scenarios a better router could not avoid without
// breaking the rule (docs/reliability.md, "Failures classified"). Every
// other explicit failure is avoidable.
func residencyRefusal(o outcome) bool {
	return o.status == 503 && o.code == subjects.CodeNoReplicas && strings.Contains(o.msg, "residency rule")
}

// sendFrom sends n small chat requests, four at a time, to a gateway of
// region from and counts where they were served.
func sendFrom(t *testing.T, url, from string, n int) regionRow {
	t.Helper()
	row := regionRow{codes: map[string]int{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan int)
	for range 4 {
		wg.Go(func() {
			for i := range next {
				o := send(context.Background(), url, chatBody("chat-small", 2, i%2 == 0))
				mu.Lock()
				if row.count(o, regionOfReplica[o.replica], from) {
					t.Errorf("request %d from %s lost: %v", i, from, o)
				}
				mu.Unlock()
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return row
}

// TestRegionsOnOneBus: two regions as two sets of replicas on one bus, a
// gateway deciding in each. Healthy, each region serves its own clients;
// a saturated region spills to the other; a region whose replicas are all
// gone fails over; a resident tenant is never served outside its region;
// a bad spill list is refused and the last good one stays.
func TestRegionsOnOneBus(t *testing.T) {
	reps := devstack.ReplicasNamed("l8-gen-0", "l8-gen-1")
	for _, id := range []string{"l8-gen-2", "l8-gen-3"} {
		r := reps[0]
		r.ID = id
		reps = append(reps, r)
	}
	for i := range reps {
		reps[i].Region = regionOfReplica[reps[i].ID]
		if reps[i].Region == "a" {
			reps[i].KVBlocks, reps[i].ITL = 64, 200*time.Millisecond
		}
	}
	st := startStack(t, devstack.Config{Replicas: reps, HeartbeatEvery: 100 * time.Millisecond, Speed: 1, NoBatcher: true,
		Gateway: gateway.Config{ID: "gw-a", Region: "a"}})
	gwA, urlA := st.Gateway(), st.GatewayURL()
	gwB, urlB := regionGateway(t, st, "b")
	kv := kvBucket(t, st)
	putJSON(t, kv, "policy", map[string]any{"dead_after": "1s", "stale_after": "500ms",
		"regions": map[string]any{"a": map[string]any{"spill": []string{"b"}}, "b": map[string]any{"spill": []string{"a"}}}})
	explain := func(g *gateway.Gateway) policy.Decision {
		return g.Decider().Router().Explain(&policy.Request{Tenant: "default", Model: "chat-small", Endpoint: subjects.EndpointChat, PromptTokens: 10}, time.Now(), nil)
	}
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, testkit.Cond("both gateways to decide in their region, every replica heard", func() bool {
		for g, region := range map[*gateway.Gateway]string{gwA: "a", gwB: "b"} {
			s := g.Table()
			if s == nil || len(s.Policy.Regions) != 2 {
				return false
			}
			if d := explain(g); d.Err != nil || d.ReplicaRegion != region {
				return false
			}
		}
		return true
	}))

	t.Run("both regions healthy: each serves its own", func(t *testing.T) {
		a, b := sendFrom(t, urlA, "a", 100), sendFrom(t, urlB, "b", 100)
		t.Logf("from a: %v; from b: %v", a, b)
		if a.local < 99 || b.local < 99 {
			t.Errorf("served locally: %d of a's, %d of b's 100; want at least 99 each", a.local, b.local)
		}
		if a.avoidable+b.avoidable > 0 {
			t.Errorf("avoidable failures: from a %v, from b %v", a, b)
		}
	})

	t.Run("a spill list naming its own region is refused; the last good stays", func(t *testing.T) {
		before := metric(st, "switchyard_broker_table_invalid_values_total", map[string]string{"kind": "policy"})
		putJSON(t, kv, "policy", map[string]any{"regions": map[string]any{"a": map[string]any{"spill": []string{"b", "a"}}}})
		testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, testkit.Cond("the value refused", func() bool {
			return metric(st, "switchyard_broker_table_invalid_values_total", map[string]string{"kind": "policy"}) > before
		}))
		if sp := gwA.Table().Policy.Regions["a"].Spill; len(sp) != 1 || sp[0] != "b" {
			t.Errorf("region a spills to %v after a refused value, want the last good [b]", sp)
		}
		putJSON(t, kv, "policy", map[string]any{"regions": map[string]any{"a": map[string]any{"spill": []string{"b"}}, "b": map[string]any{"spill": []string{"a"}}}})
	})

	t.Run("region a saturated: its overflow is served in b", func(t *testing.T) {
		// One long prompt (979 tokens, 62 of 64 blocks: kv 0.97) saturates
		// a replica of a for 25 decode steps of 200 ms; two, with prompts
		// that share no prefix, saturate the region.
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		defer func() { cancel(); wg.Wait() }()
		for i := range 2 {
			hog := `{"model":"chat-small","max_tokens":25,"messages":[{"role":"user","content":"hog ` + fmt.Sprint(i) + ` ` + strings.Repeat("long prompt ", 325) + `"}]}`
			wg.Go(func() { send(ctx, urlA, hog) })
		}
		testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, testkit.Cond("region a saturated as its gateway sees it", func() bool {
			return explain(gwA).Spilled
		}))
		row := sendFrom(t, urlA, "a", 40)
		spills := metric(st, "switchyard_broker_spilled_total", map[string]string{"from": "a", "to": "b"})
		t.Logf("from a, saturated: %v; switchyard_broker_spilled_total{from=a,to=b} %v", row, spills)
		if row.failed > 0 || row.lost > 0 {
			t.Errorf("a's clients saw failures while b had room: %v", row)
		}
		if row.spilled < 35 {
			t.Errorf("only %d of 40 spilled to b while a was saturated", row.spilled)
		}
		if spills < float64(row.spilled) {
			t.Errorf("switchyard_broker_spilled_total{from=a,to=b} = %v for %d spilled", spills, row.spilled)
		}
		if d := explain(gwA); !strings.HasPrefix(d.Reason, "spill:a->b+") || d.Region != "a" || d.ReplicaRegion != "b" {
			t.Errorf("a spilled decision says reason %q, regions %q → %q", d.Reason, d.Region, d.ReplicaRegion)
		}

		// A tenant resident in a is not spilled: it waits for a's room
		// (served there) or is refused, never served in b.
		putJSON(t, kv, "tenants.default", map[string]any{"regions": []string{"a"}})
		testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, testkit.Cond("both gateways to read the residency", func() bool {
			return gwA.Table().Tenants["default"].Regions != nil && gwB.Table().Tenants["default"].Regions != nil
		}))
		for _, url := range []string{urlA, urlB} {
			r := sendFrom(t, url, "a", 3)
			t.Logf("resident in a, a saturated, sent to %s: %v", url, r)
			if r.spilled > 0 || r.avoidable > 0 {
				t.Errorf("a tenant resident in a was served in b, or failed where it could be served: %v", r)
			}
		}
		putJSON(t, kv, "tenants.default", map[string]any{"regions": nil})
		testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, testkit.Cond("both gateways to drop the residency", func() bool {
			return gwA.Table().Tenants["default"].Regions == nil && gwB.Table().Tenants["default"].Regions == nil
		}))
	})

	t.Run("every replica of a gone: a's clients are served by b", func(t *testing.T) {
		for _, id := range []string{"l8-gen-0", "l8-gen-1"} {
			if err := st.CrashReplica(id); err != nil {
				t.Fatal(err)
			}
		}
		// The first request after the crash meets the dead replicas (no
		// responders), and is retried without them, in b.
		crashed := time.Now()
		o := send(context.Background(), urlA, chatBody("chat-small", 2, false))
		first := time.Since(crashed)
		if !o.done || regionOfReplica[o.replica] != "b" || first > 3*time.Second {
			t.Errorf("the first request after a's replicas crashed: %v after %v; want it served in b within 3 s", o, first)
		}
		// Until a's replicas are silent past dead_after (1 s here), each
		// request tries them first; retries beyond the gateway's retry
		// budget fail explicitly. None is lost.
		during := sendFrom(t, urlA, "a", 30)
		testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, testkit.Cond("a's gateway to decide b first", func() bool {
			return explain(gwA).Spilled
		}))
		failover := time.Since(crashed)
		after := sendFrom(t, urlA, "a", 30)
		t.Logf("from a, a's replicas crashed: first request served in b %v after the crash; within dead_after: %v; a's gateway decided b first %v after the crash; then %v",
			first.Round(time.Millisecond), during, failover.Round(time.Millisecond), after)
		if during.avoidable+after.avoidable > 0 || during.lost+after.lost > 0 {
			t.Errorf("a's clients with b's room: within dead_after %v, after %v; want none failed or lost", during, after)
		}
		if failover > 3*time.Second {
			t.Errorf("a's gateway decided b first %v after the crash, want within 3 s", failover)
		}
		if after.spilled != 30 {
			t.Errorf("%d of 30 served by b once a's replicas were silent past dead_after, want all: %v", after.spilled, after)
		}

		putJSON(t, kv, "tenants.default", map[string]any{"regions": []string{"a"}})
		testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, testkit.Cond("both gateways to read the residency", func() bool {
			return gwA.Table().Tenants["default"].Regions != nil && gwB.Table().Tenants["default"].Regions != nil
		}))
		for _, url := range []string{urlA, urlB} {
			o := send(context.Background(), url, chatBody("chat-small", 2, false))
			if o.done || o.code != subjects.CodeNoReplicas || !strings.Contains(o.msg, "tenants.default.regions: a") {
				t.Errorf("resident in a, a gone, sent to %s: %v; want 503 no_replicas naming the residency rule", url, o)
			}
		}
	})
}
