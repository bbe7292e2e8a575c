package policy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/features"
	"github.com/switchyard-llm/switchyard/subjects"
)

// convOn finds a conversation whose session-affine replica is replica
// (chat-small: two general replicas, no canary).
func convOn(t *testing.T, e *env, replica string) string {
	t.Helper()
	for i := range 100 {
		q := chat("chat-small")
		q.Conversation = "s-" + itoa(i)
		if d := e.explain(q); d.Replica == replica {
			return q.Conversation
		}
	}
	t.Fatalf("no conversation lands on %s", replica)
	return ""
}

func TestSessionAffinityReleaseValve(t *testing.T) {
	tests := []struct {
		name string
		kv   float64
		kept bool
	}{
		{name: "kept below the threshold", kv: 0.84, kept: true},
		{name: "released at the threshold", kv: 0.85, kept: false},
		{name: "released above the threshold", kv: 0.99, kept: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			conv := convOn(t, e, "l8-gen-0")
			e.beat("l8-gen-0", tc.kv, 4, 0)
			q := chat("chat-small")
			q.Conversation = conv
			d := e.decide(q)
			mustRoute(t, d)
			if tc.kept {
				if d.Replica != "l8-gen-0" || d.Reason != policy.ReasonSession {
					t.Fatalf("went to %s (%s), want l8-gen-0 by session affinity", d.Replica, d.Reason)
				}
				return
			}
			if d.Replica != "l8-gen-1" || d.Reason == policy.ReasonSession {
				t.Fatalf("went to %s (%s), want the affinity released to l8-gen-1", d.Replica, d.Reason)
			}
			alts := d.Alternatives()
			if len(alts) != 1 || alts[0].Replica != "l8-gen-0" || alts[0].Why != policy.WhyReleased {
				t.Fatalf("alternatives %+v, want l8-gen-0 %q", alts, policy.WhyReleased)
			}
		})
	}
}

func TestSessionAffinityPoolOverride(t *testing.T) {
	// pools.long-context raises the release threshold to 0.9: a kv of 0.87
	// is kept there but would be released in general.
	e := newEnv(t, `{"replicas.l70-long-1": {"model": "llama-3-70b-instruct", "version": "v1.5.0", "pool": "long-context", "state": "ready"}}`)
	e.beat("l70-long-1", 0.1, 0, 0)
	q := chat("chat-large")
	q.PromptTokens = 50000
	var conv, home string
	for i := range 100 {
		q.Conversation = "long-" + itoa(i)
		d := e.explain(q)
		conv, home = q.Conversation, d.Replica
		if d.Reason == policy.ReasonSession {
			break
		}
	}
	e.beat(home, 0.87, 1, 0)
	q.Conversation = conv
	if d := e.decide(q); d.Replica != home || d.Reason != policy.ReasonSession {
		t.Fatalf("kv 0.87 in long-context: %s (%s), want %s kept", d.Replica, d.Reason, home)
	}
}

func TestRendezvousMovesOneNth(t *testing.T) {
	reps := ""
	for i := range 4 {
		reps += `"replicas.r` + itoa(i) + `": {"model": "qwen-coder-32b", "version": "v1.0.0", "pool": "general", "state": "ready"},`
	}
	base := `{` + reps + `"replicas.coder-gen-0": null}`
	e := newEnv(t, base)
	for i := range 4 {
		e.beat("r"+itoa(i), 0.1, 0, 0)
	}
	const n = 4000
	before := make([]string, n)
	for i := range n {
		q := chat("code")
		q.Conversation = "c" + itoa(i)
		before[i] = e.explain(q).Replica
	}
	// A fifth replica joins: only the conversations it wins move, ≈ 1/5.
	e.retable(base, `{"replicas.r4": {"model": "qwen-coder-32b", "version": "v1.0.0", "pool": "general", "state": "ready"}}`)
	e.beat("r4", 0.1, 0, 0)
	moved := 0
	for i := range n {
		q := chat("code")
		q.Conversation = "c" + itoa(i)
		after := e.explain(q).Replica
		if after != before[i] {
			moved++
			if after != "r4" {
				t.Fatalf("%s moved %s → %s, not to the new replica", q.Conversation, before[i], after)
			}
		}
	}
	if f := float64(moved) / n; f < 0.15 || f > 0.25 {
		t.Fatalf("%.3f of conversations moved, want ≈ 0.2", f)
	}
}

func TestLoraAffinity(t *testing.T) {
	running := func(adapters ...string) func(*subjects.Heartbeat) {
		return func(h *subjects.Heartbeat) { h.Lora.Running = adapters }
	}
	teamX := func() *policy.Request { q := chat("chat-small"); q.Tenant = "team-x"; return q }

	t.Run("replica running the adapter wins over a less loaded one", func(t *testing.T) {
		e := newEnv(t)
		e.beat("l8-gen-0", 0.5, 10, 0, running("team-x-v3"))
		e.beat("l8-gen-1", 0.1, 1, 0)
		d := e.decide(teamX())
		mustRoute(t, d)
		if d.Replica != "l8-gen-0" || d.Reason != policy.ReasonLora || d.Lora != "team-x-v3" {
			t.Fatalf("%s (%s, lora %q), want l8-gen-0 by lora-affinity", d.Replica, d.Reason, d.Lora)
		}
		if a := d.Alternatives(); len(a) != 1 || a[0].Why != policy.WhyNoAdapter {
			t.Fatalf("alternatives %+v", a)
		}
	})
	t.Run("else the least loaded replica with a free slot", func(t *testing.T) {
		e := newEnv(t)
		e.beat("l8-gen-0", 0.1, 1, 0, running("a", "b", "c", "d"))
		e.beat("l8-gen-1", 0.5, 10, 0, running("a"))
		d := e.decide(teamX())
		if d.Replica != "l8-gen-1" || d.Reason != policy.ReasonLora {
			t.Fatalf("%s (%s), want l8-gen-1 (the one with room)", d.Replica, d.Reason)
		}
	})
	t.Run("a burst concentrates before the next heartbeat", func(t *testing.T) {
		e := newEnv(t)
		first := e.decide(teamX()).Replica
		for range 10 {
			if d := e.decide(teamX()); d.Replica != first || d.Reason != policy.ReasonLora {
				t.Fatalf("burst spread to %s (%s), want all on %s", d.Replica, d.Reason, first)
			}
		}
	})
	t.Run("same release valve", func(t *testing.T) {
		e := newEnv(t)
		e.beat("l8-gen-0", 0.9, 10, 0, running("team-x-v3"))
		e.beat("l8-gen-1", 0.1, 1, 0)
		if d := e.decide(teamX()); d.Replica != "l8-gen-1" {
			t.Fatalf("%s (%s), want the hot adapter replica released", d.Replica, d.Reason)
		}
	})
}

func TestPrefixAffinity(t *testing.T) {
	prompt := []byte(strings.Repeat("You are a helpful assistant. ", 300))
	blocks := features.AppendPrefix(nil, prompt, 256, 32)
	req := func() *policy.Request {
		q := chat("chat-small")
		q.Prefix = blocks
		return q
	}
	place := func(e *env, replica string, n int) {
		e.r.ObservePlacement(&subjects.Placement{Model: "llama-3-8b-instruct", Replica: replica, Blocks: blocks[:n]})
	}

	t.Run("longest chain wins", func(t *testing.T) {
		e := newEnv(t)
		place(e, "l8-gen-0", 8)
		place(e, "l8-gen-1", 20)
		d := e.decide(req())
		if d.Replica != "l8-gen-1" || d.Reason != policy.ReasonPrefix || d.PrefixMatched != 20 || d.PrefixBlocks != 32 {
			t.Fatalf("%s (%s) matched %d/%d, want l8-gen-1 with 20/32", d.Replica, d.Reason, d.PrefixMatched, d.PrefixBlocks)
		}
		if !d.Placement {
			t.Fatal("blocks 20..31 were new: the placement should be shared")
		}
		// The same request again finds the whole chain, and teaches nothing.
		d = e.decide(req())
		if d.Replica != "l8-gen-1" || d.PrefixMatched != 32 || d.Placement {
			t.Fatalf("second time: %s matched %d placement %v", d.Replica, d.PrefixMatched, d.Placement)
		}
	})
	t.Run("of two holders the lighter wins", func(t *testing.T) {
		// Either order of placement: the holders are read most recent
		// first.
		for _, light := range []string{"l8-gen-0", "l8-gen-1"} {
			e := newEnv(t)
			place(e, "l8-gen-0", 10)
			place(e, "l8-gen-1", 10)
			e.beat("l8-gen-0", 0.3, 0, 0)
			e.beat("l8-gen-1", 0.3, 0, 0)
			e.beat(light, 0.2, 0, 0)
			if d := e.explain(req()); d.Replica != light || d.PrefixMatched != 10 {
				t.Fatalf("%s matched %d, want %s (lighter)", d.Replica, d.PrefixMatched, light)
			}
		}
	})
	t.Run("warm replica above the threshold is passed over", func(t *testing.T) {
		e := newEnv(t)
		place(e, "l8-gen-0", 30)
		place(e, "l8-gen-1", 5)
		e.beat("l8-gen-0", 0.9, 0, 0)
		if d := e.explain(req()); d.Replica != "l8-gen-1" || d.PrefixMatched != 5 {
			t.Fatalf("%s matched %d, want the shorter chain on l8-gen-1", d.Replica, d.PrefixMatched)
		}
	})
	// Above the threshold with no cooler holder, the warm replica is weighed
	// against the power-of-two draw (chat-small has two replicas, so the
	// draw is the other one): it keeps the request unless the other's
	// load_score is lower by more than the matched share of the prefix
	// (a full match is worth the saturation penalty).
	t.Run("warm replica above the threshold kept when the draw gains less than the prefix", func(t *testing.T) {
		e := newEnv(t)
		place(e, "l8-gen-0", 32)
		e.beat("l8-gen-0", 0.9, 4, 0)
		e.beat("l8-gen-1", 0.3, 4, 0)
		d := e.decide(req())
		if d.Replica != "l8-gen-0" || d.Reason != policy.ReasonPrefix || d.PrefixMatched != 32 {
			t.Fatalf("%s (%s) matched %d, want l8-gen-0 kept with 32", d.Replica, d.Reason, d.PrefixMatched)
		}
	})
	t.Run("warm replica above the threshold released when the draw gains more", func(t *testing.T) {
		e := newEnv(t)
		place(e, "l8-gen-0", 32)
		e.beat("l8-gen-0", 0.96, 4, 0) // saturated: +1 on its load_score
		e.beat("l8-gen-1", 0.3, 4, 0)
		d := e.decide(req())
		if d.Replica != "l8-gen-1" || d.Reason != policy.ReasonPowerOfTwo || d.PrefixMatched != 0 {
			t.Fatalf("%s (%s) matched %d, want released to l8-gen-1 by power of two", d.Replica, d.Reason, d.PrefixMatched)
		}
		if alts := d.Alternatives(); len(alts) != 1 || alts[0].Replica != "l8-gen-0" || alts[0].Why != policy.WhyReleased {
			t.Fatalf("alternatives %+v, want l8-gen-0 %q", alts, policy.WhyReleased)
		}
	})
	t.Run("a short match is worth its share", func(t *testing.T) {
		e := newEnv(t)
		place(e, "l8-gen-0", 4) // 4/32 of the prefix: worth 0.125
		e.beat("l8-gen-0", 0.9, 4, 0)
		e.beat("l8-gen-1", 0.6, 4, 0) // 0.18 lower
		if d := e.explain(req()); d.Replica != "l8-gen-1" || d.Reason != policy.ReasonPowerOfTwo {
			t.Fatalf("%s (%s), want released to l8-gen-1", d.Replica, d.Reason)
		}
	})
	t.Run("a holder below the threshold is weighed against the draw", func(t *testing.T) {
		e := newEnv(t)
		place(e, "l8-gen-0", 4) // 4/32 of the prefix: worth 0.125
		e.beat("l8-gen-0", 0.8, 4, 0)
		e.beat("l8-gen-1", 0.4, 4, 0) // 0.24 lower
		d := e.explain(req())
		if d.Replica != "l8-gen-1" || d.Reason != policy.ReasonPowerOfTwo {
			t.Fatalf("%s (%s), want released to l8-gen-1", d.Replica, d.Reason)
		}
		if alts := d.Alternatives(); len(alts) != 1 || alts[0].Why != policy.WhyOutweighed {
			t.Fatalf("alternatives %+v, want l8-gen-0 %q", alts, policy.WhyOutweighed)
		}
		place(e, "l8-gen-0", 32) // the whole prefix: worth 1
		if d := e.explain(req()); d.Replica != "l8-gen-0" || d.Reason != policy.ReasonPrefix {
			t.Fatalf("%s (%s), want l8-gen-0 kept for its whole prefix", d.Replica, d.Reason)
		}
	})
	// Between two heartbeats every holder's kv stays as reported: taking
	// the lowest kv of a prefix every replica holds would send every
	// request to one replica until the next heartbeat. Explain leaves the
	// loads as they are, so what spreads the requests is the draw.
	four := `{"replicas.l8-gen-2": {"model": "llama-3-8b-instruct", "version": "v1.0.0", "pool": "general", "state": "ready"},
		"replicas.l8-gen-3": {"model": "llama-3-8b-instruct", "version": "v1.0.0", "pool": "general", "state": "ready"}}`
	ids := []string{"l8-gen-0", "l8-gen-1", "l8-gen-2", "l8-gen-3"}
	// spread places the prefix on the four replicas, kv base, base+0.01,
	// …, and counts where 200 explained requests go, each passed to check.
	spread := func(t *testing.T, base float64, check func(d *policy.Decision)) map[string]int {
		e := newEnv(t, four)
		for i, id := range ids {
			place(e, id, 32)
			e.beat(id, base+0.01*float64(i), 4, 0)
		}
		got := map[string]int{}
		for range 200 {
			d := e.explain(req())
			if d.Reason != policy.ReasonPrefix {
				t.Fatalf("%s (%s), want prefix affinity", d.Replica, d.Reason)
			}
			got[d.Replica]++
			check(d)
		}
		return got
	}
	t.Run("a prefix held everywhere does not herd onto the lowest kv", func(t *testing.T) {
		got := spread(t, 0.30, func(d *policy.Decision) {
			// Of the other holders, the one drawn with it lost on load,
			// the others were not drawn.
			drawn, undrawn := 0, 0
			for _, a := range d.Alternatives() {
				switch a.Why {
				case policy.WhyHigherLoad:
					drawn++
					if a.Score <= d.Score {
						t.Fatalf("%s lost to %s on load with score %v against %v", a.Replica, d.Replica, a.Score, d.Score)
					}
				case policy.WhyNotDrawnHolder:
					undrawn++
				default:
					t.Fatalf("alternative %+v: want %q or %q", a, policy.WhyHigherLoad, policy.WhyNotDrawnHolder)
				}
			}
			if drawn != 1 || undrawn != 2 {
				t.Fatalf("alternatives %+v: want one drawn and two not", d.Alternatives())
			}
		})
		// The lighter of two drawn: the lightest wins half the time, the
		// heaviest never.
		if got["l8-gen-0"] < 70 || got["l8-gen-0"] > 130 || got["l8-gen-3"] != 0 || len(got) != 3 {
			t.Fatalf("200 requests went %v, want about 100, 67 and 33 over the three lightest", got)
		}
	})
	t.Run("holders as light as each other share the requests", func(t *testing.T) {
		e := newEnv(t, four)
		for _, id := range ids[:3] {
			place(e, id, 32)
			e.beat(id, 0.3, 4, 0)
		}
		got := map[string]int{}
		for range 300 {
			got[e.explain(req()).Replica]++
		}
		for _, id := range ids[:3] {
			if got[id] < 60 {
				t.Fatalf("300 requests went %v, want about a third to each holder", got)
			}
		}
	})
	t.Run("holders above the threshold are drawn too", func(t *testing.T) {
		got := spread(t, 0.86, func(*policy.Decision) {})
		if len(got) != 3 || got["l8-gen-3"] != 0 {
			t.Fatalf("200 requests went %v, want them over the three lightest", got)
		}
	})
	t.Run("prefixes are per model", func(t *testing.T) {
		e := newEnv(t)
		e.r.ObservePlacement(&subjects.Placement{Model: "llama-3-70b-instruct", Replica: "l8-gen-0", Blocks: blocks})
		if d := e.explain(req()); d.Reason == policy.ReasonPrefix {
			t.Fatal("a placement of another model matched")
		}
	})
	t.Run("explain does not remember", func(t *testing.T) {
		e := newEnv(t)
		first := e.explain(req())
		if first.Placement {
			t.Fatal("explain asked for a placement")
		}
		if d := e.explain(req()); d.Reason == policy.ReasonPrefix {
			t.Fatal("explain remembered a prefix")
		}
	})
}

func TestLoadAware(t *testing.T) {
	t.Run("saturated replica still chosen when less loaded", func(t *testing.T) {
		e := newEnv(t)
		e.beat("l8-gen-0", 0.96, 20, 0)   // saturated by kv
		e.beat("l8-gen-1", 0.99, 32, 128) // saturated, queue full, more loaded
		for range 20 {
			d := e.explain(chat("chat-small"))
			mustRoute(t, d)
			if d.Replica != "l8-gen-0" || d.Reason != policy.ReasonPowerOfTwo {
				t.Fatalf("%s (%s), want l8-gen-0", d.Replica, d.Reason)
			}
			if a := d.Alternatives(); len(a) != 1 || a[0].Why != policy.WhySaturated || a[0].Score <= d.Score {
				t.Fatalf("alternatives %+v score %v", a, d.Score)
			}
		}
	})
	t.Run("saturated replica sorts after an unsaturated one", func(t *testing.T) {
		e := newEnv(t)
		e.beat("l8-gen-0", 0.95, 0, 0)
		e.beat("l8-gen-1", 0.80, 30, 100)
		if d := e.explain(chat("chat-small")); d.Replica != "l8-gen-1" {
			t.Fatalf("%s, want the unsaturated l8-gen-1", d.Replica)
		}
	})
	t.Run("in-flight requests count until the next heartbeat", func(t *testing.T) {
		e := newEnv(t)
		count := map[string]int{}
		for range 40 {
			count[e.decide(chat("chat-small")).Replica]++
		}
		if count["l8-gen-0"] < 15 || count["l8-gen-1"] < 15 {
			t.Fatalf("spread %v, want both used", count)
		}
		d := e.explain(chat("chat-small"))
		if d.Score < 0.1*0.6+0.1*20/32.0-0.01 {
			t.Fatalf("score %v does not include ~20 in-flight requests", d.Score)
		}
		e.beat("l8-gen-0", 0.1, 0, 0)
		e.beat("l8-gen-1", 0.1, 0, 0)
		if d := e.explain(chat("chat-small")); d.Score != 0.06 {
			t.Fatalf("score %v after heartbeats, want 0.06", d.Score)
		}
	})
	t.Run("power of two records the alternatives", func(t *testing.T) {
		e := newEnv(t, `{
			"replicas.r0": {"model": "qwen-coder-32b", "version": "v1.0.0", "pool": "general", "state": "ready"},
			"replicas.r1": {"model": "qwen-coder-32b", "version": "v1.0.0", "pool": "general", "state": "ready"},
			"replicas.r2": {"model": "qwen-coder-32b", "version": "v1.0.0", "pool": "general", "state": "ready"},
			"replicas.r3": {"model": "qwen-coder-32b", "version": "v1.0.0", "pool": "general", "state": "ready"}}`)
		for i, id := range []string{"r0", "r1", "r2", "r3", "coder-gen-0"} {
			e.beat(id, 0.1*float64(i+1), 0, 0)
		}
		d := e.explain(chat("code"))
		alts := d.Alternatives()
		if d.Reason != policy.ReasonPowerOfTwo || len(alts) != 3 {
			t.Fatalf("%s with %d alternatives", d.Reason, len(alts))
		}
		higher := 0
		for i, a := range alts {
			if i > 0 && a.Score < alts[i-1].Score {
				t.Fatalf("alternatives not ordered by score: %+v", alts)
			}
			switch a.Why {
			case policy.WhyHigherLoad:
				higher++
				if a.Score < d.Score {
					t.Fatalf("lost on load with a lower score: %+v vs %v", a, d.Score)
				}
			case policy.WhyNotSampled:
			default:
				t.Fatalf("why %q", a.Why)
			}
		}
		if higher > 1 {
			t.Fatalf("%d sampled losers, want at most 1", higher)
		}
	})
	t.Run("stale load data means a random choice", func(t *testing.T) {
		e := newEnv(t)
		e.beat("l8-gen-0", 0.8, 30, 50) // much busier, but the data is old
		e.now = e.now.Add(6 * time.Second)
		count := map[string]int{}
		for range 200 {
			d := e.explain(chat("chat-small"))
			if d.Reason != policy.ReasonStaleRandom {
				t.Fatalf("reason %s, want %s", d.Reason, policy.ReasonStaleRandom)
			}
			count[d.Replica]++
		}
		if count["l8-gen-0"] < 70 || count["l8-gen-1"] < 70 {
			t.Fatalf("stale choice not random: %v", count)
		}
	})
	t.Run("dead heartbeat is not a candidate", func(t *testing.T) {
		e := newEnv(t)
		e.now = e.now.Add(10 * time.Second)
		e.beat("l8-gen-1", 0.1, 0, 0)
		e.now = e.now.Add(6 * time.Second) // l8-gen-0's heartbeat is now 16 s old
		for range 20 {
			if d := e.explain(chat("chat-small")); d.Replica != "l8-gen-1" || d.Reason != policy.ReasonOnly {
				t.Fatalf("%s (%s), want l8-gen-1 alone", d.Replica, d.Reason)
			}
		}
	})
	t.Run("replica without a heartbeat is not a candidate", func(t *testing.T) {
		e := newEnv(t)
		e.retable(`{"replicas.l8-new": {"model": "llama-3-8b-instruct", "version": "v1.0.0", "pool": "general", "state": "ready"}}`)
		for range 50 {
			if d := e.explain(chat("chat-small")); d.Replica == "l8-new" {
				t.Fatal("routed to a replica that never sent a heartbeat")
			}
		}
	})
}

// A warm replica the exact index names gives a request up when its prefill
// work ahead exceeds the power-of-two pair's lighter replica's by more than
// twice the request's prompt, though load_score alone would keep it there;
// a holder named by placements, a guess, keeps it.
func TestPrefixAffinityWeighsAnExactHolderByPrefillWork(t *testing.T) {
	blocks, req := promptOf2048()
	for _, c := range []struct {
		name   string
		exact  bool
		queued int
		want   string
		reason string
	}{
		{"exact, 4 000 tokens more", true, 4000, "l8-gen-0", policy.ReasonPrefix},
		{"exact, 8 000 tokens more", true, 8000, "l8-gen-1", policy.ReasonPowerOfTwo},
		{"placements, 8 000 tokens more", false, 8000, "l8-gen-0", policy.ReasonPrefix},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			if c.exact {
				e.beat("l8-gen-0", 0.3, 4, 0, prefill(1000, c.queued), kvFeed)
				holds(t, e, "l8-gen-0", blocks)
			} else {
				e.beat("l8-gen-0", 0.3, 4, 0, prefill(1000, c.queued))
				e.r.ObservePlacement(&subjects.Placement{Model: "llama-3-8b-instruct", Replica: "l8-gen-0", Blocks: blocks})
			}
			e.beat("l8-gen-1", 0.25, 4, 0, prefill(1000, 0), kvFeed) // the pair's lighter
			d := e.explain(req())
			mustRoute(t, d)
			if d.Replica != c.want || d.Reason != c.reason {
				t.Fatalf("%s (%s), want %s (%s)", d.Replica, d.Reason, c.want, c.reason)
			}
			if c.want == "l8-gen-1" {
				if a := d.Alternatives(); len(a) != 1 || a[0].Why != policy.WhyMoreWork {
					t.Fatalf("alternatives %+v, want l8-gen-0 lost for %q", a, policy.WhyMoreWork)
				}
			}
		})
	}
}
