package decider

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/features"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// withPDReplicas registers the dev table's disaggregated model's two
// prefill and two decode replicas on b, each with a fresh heartbeat.
func withPDReplicas(t *testing.T, b *Decider, now time.Time) {
	t.Helper()
	snap := b.Table().Clone()
	for id, role := range map[string]string{"pd-p0": "prefill", "pd-p1": "prefill", "pd-d0": "decode", "pd-d1": "decode"} {
		v, err := table.Decode("replicas."+id, []byte(`{"model":"llama-3-70b-pd","version":"v1.0.0","pool":"general",`+
			`"max_batch":32,"max_queue":128,"state":"ready","role":"`+role+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		snap.Set(v, nil)
	}
	b.SetTable(snap)
	for _, id := range []string{"pd-p0", "pd-p1", "pd-d0", "pd-d1"} {
		beatPD(b, id, 0.1, now)
	}
}

func beatPD(b *Decider, id string, kv float64, now time.Time) {
	b.router.ObserveHeartbeat(&subjects.Heartbeat{
		Replica: id, Model: "llama-3-70b-pd", Version: "v1.0.0", Pool: "general", State: subjects.StateReady,
		KVUsage: kv, Running: int(kv * 32), MaxBatch: 32, MaxQueue: 128, ScrapeOK: true,
	}, now)
}

// A split request's placement names both replicas that hold its prefix:
// the prefill replica that computed the blocks and the decode replica that
// pulled them. Another decider that hears it sends the next prompt with
// that prefix to the same prefill replica, though it is the busier one,
// as the decider that placed it would.
func TestSplitPlacementTeachesThePrefillReplica(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	a, b := newTestBroker(t, 0, now), newTestBroker(t, 0, now)
	withPDReplicas(t, a, now)
	withPDReplicas(t, b, now)

	h := gatewayHeaders()
	h.Set(subjects.HdrModel, "llama-3-70b-pd")
	h.Del(subjects.HdrConversation)
	h.Set(subjects.HdrPromptTokens, "8000") // 32 prefix blocks, the rest uncached
	var msg nats.Msg
	if !handleInto(a, NewScratch(), "llm.gw.default", "_INBOX.split", h, nil, &msg) {
		t.Fatalf("not forwarded: %v", msg.Header)
	}
	decode, prefill := msg.Header.Get(subjects.HdrRouteReplica), msg.Header.Get(subjects.HdrRoutePrefill)
	if prefill == "" {
		t.Fatalf("served whole: %s", msg.Header.Get(subjects.HdrRouteReason))
	}

	var placed *subjects.Placement
	for placed == nil {
		select {
		case m := <-a.out:
			if p, ok := m.data.(*subjects.Placement); ok {
				placed = p
			}
		default:
			t.Fatal("the split published no placement")
		}
	}
	if placed.Replica != decode || placed.Prefill != prefill || placed.Model != "llama-3-70b-pd" {
		t.Fatalf("placement %+v, want decode %s and prefill %s", placed, decode, prefill)
	}
	data, err := encode(placed)
	if err != nil {
		t.Fatal(err)
	}
	b.onPlacement(&nats.Msg{Subject: b.subj.Placement(placed.Model), Header: nats.Header{subjects.HdrBroker: {"peer"}}, Data: data})

	// The prefill replica that holds the prefix is now the busier one; the
	// prefix still draws the prefill leg there, below the release
	// threshold.
	beatPD(b, prefill, 0.5, now)
	prefix, err := features.ParsePrefixHeader(nil, h.Get(subjects.HdrPrefix))
	if err != nil {
		t.Fatal(err)
	}
	req := policy.Request{Tenant: "default", Model: "llama-3-70b-pd", Endpoint: subjects.EndpointChat, PromptTokens: 20000, Prefix: prefix}
	d := b.router.Explain(&req, now, rand.New(rand.NewPCG(1, 2)))
	if d.Err != nil {
		t.Fatal(d.Err)
	}
	if d.Prefill != prefill || d.Replica != decode {
		t.Errorf("the peer sends the prefill leg to %q and the decode to %q, want %s and %s (they hold the prefix)", d.Prefill, d.Replica, prefill, decode)
	}
	if want := 20000 - len(prefix)*64; d.UncachedTokens != want {
		t.Errorf("uncached %d, want %d (the decode replica holds the prefix)", d.UncachedTokens, want)
	}
}
