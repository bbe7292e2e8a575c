package policy_test

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/broker/policy"
	examples "github.com/switchyard-llm/switchyard/deploy/examples"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// Two regions of llama-3-8b-instruct's general pool: l8-gen-0 and -1 in
// eu, l8-gen-2 and -3 in us.
var regionOf = map[string]string{"l8-gen-0": "eu", "l8-gen-1": "eu", "l8-gen-2": "us", "l8-gen-3": "us"}

const (
	twoRegions = `{"policy": {"allow_anonymous": true, "regions": {"eu": {"spill": ["us"], "penalty": "80ms"}, "us": {"spill": ["eu"]}}},
		"tenants.eu-only": {"regions": ["eu"]}}`
	noSpill = `{"policy": {"allow_anonymous": true}, "tenants.eu-only": {"regions": ["eu"]}}`
)

// newRegionEnv is newEnv for a router of region (none: ""), with the four
// replicas of regionOf heartbeating idle in their regions.
func newRegionEnv(t *testing.T, region string, extra ...string) *env {
	t.Helper()
	flats := [][]byte{examples.Table(), devReplicas(t)}
	for _, x := range append(fourL8(""), extra...) {
		flats = append(flats, []byte(x))
	}
	s := build(t, flats...)
	e := &env{t: t, r: policy.New(policy.Config{Self: "b1", Region: region}), now: t0, rng: rand.New(rand.NewPCG(1, 2))}
	e.r.SetTable(s)
	for id := range s.Replicas {
		e.regionBeat(id, 0.1)
	}
	return e
}

// regionBeat is beat for a replica in its region of regionOf.
func (e *env) regionBeat(id string, kv float64) {
	e.beat(id, kv, 0, 0, func(hb *subjects.Heartbeat) { hb.Region = regionOf[id] })
}

// servedIn decides n requests of tenant and counts them by the chosen
// replica's region, failing on a refusal.
func servedIn(e *env, tenant string, n int, mod func(*policy.Request)) map[string]int {
	e.t.Helper()
	got := map[string]int{}
	for i := range n {
		q := chat("chat-small")
		q.Tenant = tenant
		q.ID = "r" + string(rune('a'+i%26))
		if mod != nil {
			mod(q)
		}
		d := e.decide(q)
		mustRoute(e.t, d)
		if d.ReplicaRegion != regionOf[d.Replica] {
			e.t.Fatalf("decision says region %q for %s, in %q", d.ReplicaRegion, d.Replica, regionOf[d.Replica])
		}
		got[d.ReplicaRegion]++
	}
	return got
}

func TestRegions(t *testing.T) {
	t.Run("without a region every replica serves", func(t *testing.T) {
		e := newRegionEnv(t, "", twoRegions)
		if got := servedIn(e, "default", 200, nil); got["eu"] == 0 || got["us"] == 0 {
			t.Errorf("a router without a region served %v, want both regions", got)
		}
	})
	t.Run("local first", func(t *testing.T) {
		e := newRegionEnv(t, "eu", twoRegions)
		if got := servedIn(e, "default", 200, nil); got["eu"] != 200 {
			t.Errorf("healthy eu served %v, want all 200 in eu", got)
		}
		d := e.decide(chat("chat-small"))
		if d.Region != "eu" || d.Spilled || strings.HasPrefix(d.Reason, policy.ReasonSpill) {
			t.Errorf("region %q, spilled %v, reason %q", d.Region, d.Spilled, d.Reason)
		}
	})
	t.Run("affinity stays in the region", func(t *testing.T) {
		e := newRegionEnv(t, "eu", twoRegions)
		got := servedIn(e, "default", 100, func(q *policy.Request) { q.Conversation = "c-" + q.ID + "-x" })
		if got["eu"] != 100 {
			t.Errorf("session-affine requests served %v, want all in eu", got)
		}
	})
	t.Run("one local replica saturated: the other local one serves", func(t *testing.T) {
		e := newRegionEnv(t, "eu", twoRegions)
		e.regionBeat("l8-gen-0", 0.97)
		if got := servedIn(e, "default", 100, nil); got["eu"] != 100 {
			t.Errorf("served %v, want all in eu", got)
		}
	})
	t.Run("every local replica saturated: spill, with the penalty", func(t *testing.T) {
		e := newRegionEnv(t, "eu", twoRegions)
		e.regionBeat("l8-gen-0", 0.97)
		e.regionBeat("l8-gen-1", 0.99)
		d := e.decide(chat("chat-small"))
		mustRoute(t, d)
		if !d.Spilled || d.ReplicaRegion != "us" || !strings.HasPrefix(d.Reason, "spill:eu->us+") {
			t.Fatalf("spilled %v to %q (%s), want spill:eu->us", d.Spilled, d.ReplicaRegion, d.Reason)
		}
		// The heartbeat's TTFT is 50 ms; the penalty 80 ms.
		if d.PredictedTTFT < 130 {
			t.Errorf("predicted TTFT %v ms, want the 80 ms penalty on top of 50 ms", d.PredictedTTFT)
		}
		if got := servedIn(e, "default", 100, nil); got["us"] != 100 {
			t.Errorf("saturated eu served %v, want all 100 in us", got)
		}
	})
	t.Run("every region saturated: the local replicas keep it", func(t *testing.T) {
		e := newRegionEnv(t, "eu", twoRegions)
		for id := range regionOf {
			e.regionBeat(id, 0.97)
		}
		if got := servedIn(e, "default", 100, nil); got["eu"] != 100 {
			t.Errorf("served %v, want all in eu (saturated is deprioritised, not excluded)", got)
		}
	})
	t.Run("no local replica live: fail over", func(t *testing.T) {
		e := newRegionEnv(t, "eu", twoRegions)
		q := chat("chat-small")
		q.Exclude = []string{"l8-gen-0", "l8-gen-1"} // refused this request already
		d := e.decide(q)
		mustRoute(t, d)
		if !d.Spilled || d.ReplicaRegion != "us" {
			t.Errorf("spilled %v to %q (%s), want us", d.Spilled, d.ReplicaRegion, d.Reason)
		}
	})
	t.Run("no spill list: never leaves the region", func(t *testing.T) {
		e := newRegionEnv(t, "eu", noSpill)
		e.regionBeat("l8-gen-0", 0.97)
		e.regionBeat("l8-gen-1", 0.97)
		if got := servedIn(e, "default", 50, nil); got["eu"] != 50 {
			t.Errorf("served %v, want all in eu", got)
		}
		q := chat("chat-small")
		q.Exclude = []string{"l8-gen-0", "l8-gen-1"}
		mustReject(t, e.decide(q), 503, subjects.CodeNoReplicas)
	})

	// Residency: tenant eu-only may be served in eu alone.
	t.Run("residency: a router elsewhere sends to the tenant's region", func(t *testing.T) {
		e := newRegionEnv(t, "us", twoRegions)
		if got := servedIn(e, "eu-only", 100, nil); got["eu"] != 100 {
			t.Errorf("served %v, want all in eu", got)
		}
	})
	t.Run("residency: a router whose spill list does not lead there still serves the tenant at home", func(t *testing.T) {
		e := newRegionEnv(t, "us", `{"policy": {"allow_anonymous": true, "regions": {"eu": {"spill": ["us"]}}}, "tenants.eu-only": {"regions": ["eu"]}}`)
		q := chat("chat-small")
		q.Tenant = "eu-only"
		d := e.decide(q)
		mustRoute(t, d)
		if d.ReplicaRegion != "eu" || !d.Spilled || !strings.HasPrefix(d.Reason, "spill:us->eu+") {
			t.Errorf("served in %q (%s), want eu, spilled from us", d.ReplicaRegion, d.Reason)
		}
		// us sets no penalty: the default 50 ms on top of the heartbeat's 50 ms.
		if d.PredictedTTFT < 100 {
			t.Errorf("predicted TTFT %v ms, want the default penalty on top", d.PredictedTTFT)
		}
		if got := servedIn(e, "eu-only", 50, nil); got["eu"] != 50 {
			t.Errorf("served %v, want all in eu", got)
		}
	})
	t.Run("residency: saturated at home is never served abroad", func(t *testing.T) {
		e := newRegionEnv(t, "eu", twoRegions)
		e.regionBeat("l8-gen-0", 0.97)
		e.regionBeat("l8-gen-1", 0.97)
		if got := servedIn(e, "eu-only", 100, nil); got["eu"] != 100 {
			t.Errorf("served %v, want all in eu", got)
		}
		if got := servedIn(e, "default", 10, nil); got["us"] != 10 {
			t.Errorf("another tenant served %v, want the spill to us", got)
		}
	})
	t.Run("residency: gone at home is refused naming the rule", func(t *testing.T) {
		for _, region := range []string{"eu", "us", ""} {
			e := newRegionEnv(t, region, twoRegions)
			for _, prio := range []string{"", subjects.PriorityBatch} {
				q := chat("chat-small")
				q.Tenant, q.Priority = "eu-only", prio
				q.Exclude = []string{"l8-gen-0", "l8-gen-1"}
				d := e.decide(q)
				mustReject(t, d, 503, subjects.CodeNoReplicas)
				if !strings.Contains(d.Err.Message, "tenants.eu-only.regions: eu") {
					t.Errorf("router %q, priority %q: message %q does not name the residency rule", region, prio, d.Err.Message)
				}
			}
		}
	})
	t.Run("residency without regions on the router", func(t *testing.T) {
		e := newRegionEnv(t, "", twoRegions)
		got := servedIn(e, "eu-only", 100, nil)
		got2 := servedIn(e, "eu-only", 50, func(q *policy.Request) { q.Priority = subjects.PriorityBatch })
		if got["eu"] != 100 || got2["eu"] != 50 {
			t.Errorf("served %v and batch %v, want all in eu", got, got2)
		}
	})
	t.Run("a replica of a region the table does not name is never resident", func(t *testing.T) {
		e := newRegionEnv(t, "", twoRegions)
		for id := range regionOf {
			e.beat(id, 0.1, 0, 0, func(hb *subjects.Heartbeat) { hb.Region = "ap" })
		}
		q := chat("chat-small")
		q.Tenant = "eu-only"
		mustReject(t, e.decide(q), 503, subjects.CodeNoReplicas)
	})
}

// TestSpillPenaltySource: a spill's penalty is the table's
// policy.regions.<from>.penalty when set; else the round trip measured to
// the region (SetRegionRTT), per region; else table.DefaultSpillPenalty,
// until a measurement. The decision says which, and adds it to the
// remote candidates' predicted TTFT.
func TestSpillPenaltySource(t *testing.T) {
	spill := func(e *env) *policy.Decision {
		t.Helper()
		q := chat("chat-small")
		q.Exclude = []string{"l8-gen-2", "l8-gen-3"} // us has none left: spill to eu
		d := e.decide(q)
		mustRoute(t, d)
		if !d.Spilled || d.ReplicaRegion != "eu" {
			t.Fatalf("spilled %v to %q (%s), want eu", d.Spilled, d.ReplicaRegion, d.Reason)
		}
		return d
	}
	// us sets no penalty (twoRegions), eu sets 80 ms.
	e := newRegionEnv(t, "us", twoRegions)
	d := spill(e)
	if d.SpillPenalty != table.DefaultSpillPenalty || d.SpillPenaltySource != policy.PenaltyDefault {
		t.Errorf("before a measurement: penalty %v (%s), want the default %v", d.SpillPenalty, d.SpillPenaltySource, table.DefaultSpillPenalty)
	}
	e.r.SetRegionRTT(map[string]time.Duration{"eu": 120 * time.Millisecond, "ap": time.Millisecond})
	d = spill(e)
	if d.SpillPenalty != 120*time.Millisecond || d.SpillPenaltySource != policy.PenaltyMeasured {
		t.Errorf("measured 120ms to eu: penalty %v (%s)", d.SpillPenalty, d.SpillPenaltySource)
	}
	// The heartbeat's TTFT is 50 ms, the measured penalty 120 ms.
	if d.PredictedTTFT < 170 {
		t.Errorf("predicted TTFT %v ms, want the measured 120 ms on top of 50 ms", d.PredictedTTFT)
	}
	// The measurement outlives a new table.
	e.r.SetTable(e.r.Table())
	if p, src := e.r.SpillPenalty("eu"); p != 120*time.Millisecond || src != policy.PenaltyMeasured {
		t.Errorf("after SetTable: penalty to eu %v (%s), want the measured 120ms", p, src)
	}
	// A region no longer measured goes back to the default.
	e.r.SetRegionRTT(map[string]time.Duration{})
	if d = spill(e); d.SpillPenaltySource != policy.PenaltyDefault {
		t.Errorf("measurement gone: penalty %v (%s), want the default", d.SpillPenalty, d.SpillPenaltySource)
	}

	// eu's table penalty wins over a measurement.
	e = newRegionEnv(t, "eu", twoRegions)
	e.r.SetRegionRTT(map[string]time.Duration{"us": 5 * time.Millisecond})
	if p, src := e.r.SpillPenalty("us"); p != 80*time.Millisecond || src != policy.PenaltyTable {
		t.Errorf("table 80ms, measured 5ms: penalty %v (%s), want the table's", p, src)
	}
	e.regionBeat("l8-gen-0", 0.97)
	e.regionBeat("l8-gen-1", 0.99)
	if d := e.decide(chat("chat-small")); d.SpillPenalty != 80*time.Millisecond || d.SpillPenaltySource != policy.PenaltyTable {
		t.Errorf("spill from eu: penalty %v (%s), want the table's 80ms", d.SpillPenalty, d.SpillPenaltySource)
	}
	if w := e.decide(chat("chat-small")).Wire(chat("chat-small")); w.SpillPenaltyMillis != 80 || w.SpillPenaltySource != "table" {
		t.Errorf("wire: penalty %v ms (%s), want 80 (table)", w.SpillPenaltyMillis, w.SpillPenaltySource)
	}
}
