package policy_test

import (
	"slices"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/subjects"
)

// failing sets a replica's reported engine-failure streak.
func failing(n int, successes uint64) func(*subjects.Heartbeat) {
	return func(h *subjects.Heartbeat) { h.EngineFailures, h.EngineSuccesses = n, successes }
}

// routedTo collects the replicas of n decisions.
func routedTo(t *testing.T, e *env, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for range n {
		d := e.decide(chat("chat-small"))
		mustRoute(t, d)
		got[d.Replica]++
	}
	return got
}

func TestOutlierEjection(t *testing.T) {
	t.Run("a streak of engine failures ejects the replica", func(t *testing.T) {
		e := newEnv(t)
		var seen []policy.EjectedReplica
		withOnEject(e, func(x policy.EjectedReplica) { seen = append(seen, x) })
		e.beat("l8-gen-0", 0.1, 0, 0)
		e.beat("l8-gen-1", 0.1, 0, 0, failing(policy.EjectAfter-1, 0))
		if got := routedTo(t, e, 40); got["l8-gen-1"] == 0 {
			t.Fatalf("one failure short of the streak, l8-gen-1 got nothing: %v", got)
		}
		e.beat("l8-gen-1", 0.1, 0, 0, failing(policy.EjectAfter, 0))
		if got := routedTo(t, e, 40); got["l8-gen-1"] != 0 {
			t.Fatalf("ejected replica still routed to: %v", got)
		}
		d := e.decide(chat("chat-small"))
		w := d.Wire(chat("chat-small"))
		if !slices.Equal(w.Ejected, []string{"l8-gen-1"}) || w.EjectPanic {
			t.Fatalf("decision says ejected %v panic %v", w.Ejected, w.EjectPanic)
		}
		if len(seen) != 1 || seen[0].Replica != "l8-gen-1" || seen[0].Until.Sub(e.now) != policy.EjectBase {
			t.Fatalf("OnEject calls %+v", seen)
		}
		if ej := e.r.Ejected(e.now); len(ej) != 1 || ej[0].Replica != "l8-gen-1" {
			t.Fatalf("Ejected() %+v", ej)
		}

		// Back in rotation after the back-off; the old streak is not
		// punished twice.
		e.now = e.now.Add(policy.EjectBase)
		e.beat("l8-gen-0", 0.1, 0, 0)
		e.beat("l8-gen-1", 0.1, 0, 0, failing(policy.EjectAfter, 0))
		if got := routedTo(t, e, 40); got["l8-gen-1"] == 0 {
			t.Fatalf("after the back-off l8-gen-1 got nothing: %v", got)
		}
		// Failing on: ejected again, for twice as long.
		e.beat("l8-gen-1", 0.1, 0, 0, failing(2*policy.EjectAfter, 0))
		if len(seen) != 2 || seen[1].Until.Sub(e.now) != 2*policy.EjectBase {
			t.Fatalf("second ejection %+v, want %v", seen, 2*policy.EjectBase)
		}
		e.now = e.now.Add(2 * policy.EjectBase)
		e.beat("l8-gen-0", 0.1, 0, 0)
		// A success ends the streak; a new streak counts from zero.
		e.beat("l8-gen-1", 0.1, 0, 0, failing(policy.EjectAfter-1, 1))
		if len(seen) != 2 {
			t.Fatalf("ejected on a streak of %d: %+v", policy.EjectAfter-1, seen)
		}
		e.beat("l8-gen-1", 0.1, 0, 0, failing(policy.EjectAfter, 1))
		if len(seen) != 3 {
			t.Fatalf("new streak not ejected: %+v", seen)
		}
	})
	t.Run("the panic threshold keeps a failing pool in rotation", func(t *testing.T) {
		e := newEnv(t)
		e.beat("l8-gen-0", 0.1, 0, 0, failing(policy.EjectAfter, 0))
		e.beat("l8-gen-1", 0.1, 0, 0, failing(policy.EjectAfter, 0))
		got := routedTo(t, e, 40)
		if got["l8-gen-0"] == 0 || got["l8-gen-1"] == 0 {
			t.Fatalf("a pool-wide failure ejected replicas: %v", got)
		}
		if d := e.decide(chat("chat-small")); !d.EjectPanic || d.NEjected != 2 {
			t.Fatalf("decision panic %v ejected %d", d.EjectPanic, d.NEjected)
		}
	})
	t.Run("a pool of one never ejects", func(t *testing.T) {
		e := newEnv(t)
		e.beat("coder-gen-0", 0.1, 0, 0, failing(3*policy.EjectAfter, 0))
		mustRoute(t, e.decide(chat("qwen-coder-32b")))
	})
	t.Run("the back-off is capped", func(t *testing.T) {
		e := newEnv(t)
		var last policy.EjectedReplica
		withOnEject(e, func(x policy.EjectedReplica) { last = x })
		n, d := 0, time.Duration(0)
		for range 12 {
			n += policy.EjectAfter
			e.beat("l8-gen-1", 0.1, 0, 0, failing(n, 0))
			d = last.Until.Sub(e.now)
			e.now = last.Until
		}
		if last.Count != 12 || d != policy.EjectMax {
			t.Fatalf("12th ejection %+v for %v, want %v", last, d, policy.EjectMax)
		}
	})
}

// withOnEject replaces e's router with one that reports ejections to f.
func withOnEject(e *env, f func(policy.EjectedReplica)) {
	s := e.r.Table()
	e.r = policy.New(policy.Config{Self: "b1", OnEject: f})
	e.r.SetTable(s)
	for id := range s.Replicas {
		e.beat(id, 0.1, 0, 0)
	}
}
