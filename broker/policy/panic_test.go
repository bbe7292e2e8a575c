package policy_test

import (
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/subjects"
)

// fourL8 registers two more general replicas of llama-3-8b-instruct beside
// l8-gen-0 and l8-gen-1, and the pool's panic threshold when given.
func fourL8(panicBelow string) []string {
	extra := []string{`{"replicas.l8-gen-2": {"model": "llama-3-8b-instruct", "version": "v1.0.0", "pool": "general", "state": "ready"},
		"replicas.l8-gen-3": {"model": "llama-3-8b-instruct", "version": "v1.0.0", "pool": "general", "state": "ready"}}`}
	if panicBelow != "" {
		extra = append(extra, `{"pools.general": {"panic_below": `+panicBelow+`}}`)
	}
	return extra
}

// TestPanicThreshold: when fewer than panic_below of a pool's ready
// replicas look alive, the choice is over all of them (reason panic), as
// Envoy's panic threshold; a replica draining or failing its health checks
// stays out, and so does one the gateway's retry excluded.
func TestPanicThreshold(t *testing.T) {
	spreadOver := func(e *env, q func() *policy.Request) map[string]int {
		got := map[string]int{}
		for range 200 {
			d := e.decide(q())
			mustRoute(e.t, d)
			got[d.Replica]++
		}
		return got
	}
	// Every replica heard at t0; 16 s later (dead_after 15 s) only the
	// ones listed are heard again.
	silence := func(e *env, heard ...string) {
		e.now = t0.Add(16 * time.Second)
		for _, id := range heard {
			e.beat(id, 0.1, 0, 0)
		}
	}

	t.Run("3 of 4 silent: all 4 candidates, reason panic", func(t *testing.T) {
		e := newEnv(t, fourL8("")...)
		silence(e, "l8-gen-0")
		d := e.decide(chat("chat-small"))
		mustRoute(t, d)
		if !d.Panic || d.Reason[:len("panic+")] != "panic+" {
			t.Errorf("reason %q, Panic %v; want a decision in panic", d.Reason, d.Panic)
		}
		got := spreadOver(e, func() *policy.Request { return chat("chat-small") })
		if len(got) != 4 {
			t.Errorf("200 decisions in panic went to %v, want all 4 replicas", got)
		}
	})
	t.Run("excluded and draining stay out in panic", func(t *testing.T) {
		e := newEnv(t, fourL8("")...)
		silence(e, "l8-gen-0")
		e.beat("l8-gen-1", 0.1, 0, 0, func(hb *subjects.Heartbeat) { hb.State = subjects.StateDraining })
		e.now = e.now.Add(time.Millisecond)
		got := spreadOver(e, func() *policy.Request {
			q := chat("chat-small")
			q.Exclude = []string{"l8-gen-2"}
			return q
		})
		if got["l8-gen-1"] != 0 || got["l8-gen-2"] != 0 || got["l8-gen-3"] == 0 || got["l8-gen-0"] == 0 {
			t.Errorf("in panic: %v; want l8-gen-0 and l8-gen-3 only (l8-gen-1 draining, l8-gen-2 excluded)", got)
		}
	})
	t.Run("at the threshold: no panic", func(t *testing.T) {
		e := newEnv(t, fourL8("")...)
		silence(e, "l8-gen-0", "l8-gen-1") // 2 of 4 = 0.5, not below it
		got := spreadOver(e, func() *policy.Request { return chat("chat-small") })
		if got["l8-gen-2"]+got["l8-gen-3"] != 0 {
			t.Errorf("2 of 4 alive (not below 0.5): %v; want the live ones only", got)
		}
	})
	t.Run("panic_below 0: never", func(t *testing.T) {
		e := newEnv(t, fourL8("0")...)
		silence(e, "l8-gen-0")
		got := spreadOver(e, func() *policy.Request { return chat("chat-small") })
		if got["l8-gen-0"] != 200 {
			t.Errorf("panic_below 0: %v; want the live replica only", got)
		}
	})
	t.Run("none alive: no panic, no_replicas", func(t *testing.T) {
		e := newEnv(t, fourL8("")...)
		silence(e, "l8-gen-0") // the coder replicas silent while another is heard
		mustReject(t, e.decide(chat("qwen-coder-32b")), 503, subjects.CodeNoReplicas)
	})
}

// A claim that a replica is gone (a no-responders the gateway saw) takes
// it out only while it is silent past dead_after, and only until its next
// heartbeat: a heartbeating replica is never taken out on such a claim.
func TestMarkGoneTakesOutOnlyTheSilent(t *testing.T) {
	e := newEnv(t)
	if e.r.MarkGone("l8-gen-0", e.now) {
		t.Fatal("a replica heard just now was taken out")
	}
	later := e.now.Add(20 * time.Second)
	if !e.r.MarkGone("l8-gen-0", later) {
		t.Fatal("a replica silent past dead_after was not taken out")
	}
	e.now = later
	e.beat("l8-gen-0", 0.1, 0, 0)
	if _, live := e.r.Live("l8-gen-0", later); !live {
		t.Fatal("a replica taken out was not back with its next heartbeat")
	}
}
