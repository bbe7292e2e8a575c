package policy

import (
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

func TestPrefixMapBounded(t *testing.T) {
	a, b := &replica{id: "a"}, &replica{id: "b"}
	m := newPrefixMap(64)
	for h := range uint64(10000) {
		m.put(h, a)
		if h%10 == 0 {
			m.put(7, a) // keep touching 7: the reference bit must save it
		}
	}
	if m.len() != 64 || len(m.slots) != 128 {
		t.Fatalf("map grew: %d entries, %d slots", m.len(), len(m.slots))
	}
	if m.get(7) == nil {
		t.Fatal("a block in use was evicted")
	}
	if m.get(9999) == nil || m.get(0) != nil {
		t.Fatal("eviction is not oldest-first")
	}
	used := 0
	for i := range m.slots {
		if e := &m.slots[i]; e.used {
			used++
			if m.find(e.key) != i {
				t.Fatalf("entry %x at slot %d is not found there", e.key, i)
			}
		}
	}
	if used != m.len() {
		t.Fatalf("%d used slots, %d counted", used, m.len())
	}
	next := uint64(1 << 40)
	allocs := testing.AllocsPerRun(1000, func() { next++; m.put(next, b) })
	if allocs > 0.01 {
		t.Fatalf("a full map allocates %v per put", allocs)
	}
}

func TestPrefixMapWays(t *testing.T) {
	x := []*replica{{id: "0"}, {id: "1"}, {id: "2"}, {id: "3"}, {id: "4"}}
	m := newPrefixMap(8)
	if !m.put(1, x[0]) || m.put(1, x[0]) {
		t.Fatal("put should report only what is new")
	}
	for _, r := range x[1:] {
		m.put(1, r)
	}
	e := m.get(1)
	if e.reps != [prefixWays]*replica{x[4], x[3], x[2], x[1]} {
		t.Fatalf("ways %v, want most recent first", e.reps)
	}
	m.put(1, x[2]) // moves to the front without losing anyone
	if e.reps != [prefixWays]*replica{x[2], x[4], x[3], x[1]} {
		t.Fatalf("ways after a repeat %v", e.reps)
	}
}

func TestPrefixMapForget(t *testing.T) {
	x := []*replica{{id: "0"}, {id: "1"}, {id: "2"}}
	m := newPrefixMap(8) // 16 slots: 1, 17 and 33 share a home slot
	for _, r := range x {
		m.put(1, r)
	}
	m.put(17, x[0])
	m.put(33, x[0])
	m.put(2, x[1])
	m.forget(1, x[1])
	if e := m.get(1); e.reps != [prefixWays]*replica{x[2], x[0]} {
		t.Fatalf("ways after forgetting 1 %v, want the others in order", e.reps)
	}
	m.forget(1, x[1]) // not there: nothing changes
	m.forget(9, x[0]) // no such block
	m.forget(1, x[2])
	m.forget(1, x[0]) // empty: 17 and 33 shift back over it
	if m.get(1) != nil || m.get(17) == nil || m.get(33) == nil || m.get(2) == nil || m.len() != 3 {
		t.Fatalf("after forgetting block 1: 1 %v, 17 %v, 33 %v, 2 %v, %d entries", m.get(1), m.get(17), m.get(33), m.get(2), m.len())
	}
	if m.find(17) != 1 || m.find(33) != 2 {
		t.Fatalf("17 and 33 at slots %d and %d, want shifted back to 1 and 2", m.find(17), m.find(33))
	}
}

// TestPrefixMapForgetReplica removes a replica from a crowded table and
// compares it with a plain map of what it should hold.
func TestPrefixMapForgetReplica(t *testing.T) {
	x, y := &replica{id: "x"}, &replica{id: "y"}
	m := newPrefixMap(50)     // 128 slots
	want := map[uint64]bool{} // key → y holds it
	for i := range 50 {
		// Keys crowd a few home slots, and the last wrap past the end.
		h := uint64(i%7)*128 + uint64(120+i%13) + uint64(i/7)<<20
		m.put(h, x)
		if i%3 == 0 {
			m.put(h, y)
			want[h] = true
		}
	}
	m.forgetReplica(x)
	if m.len() != len(want) {
		t.Fatalf("%d entries left, want the %d y holds", m.len(), len(want))
	}
	for h := range want {
		e := m.get(h)
		if e == nil || e.reps != [prefixWays]*replica{y} {
			t.Fatalf("block %x: %v, want y alone", h, e)
		}
	}
}

// TestPrefixMapAgainstReference drives the table with colliding keys and
// compares it with a plain map of what it should hold.
func TestPrefixMapAgainstReference(t *testing.T) {
	x := &replica{id: "x"}
	m := newPrefixMap(50) // 128 slots
	for round := range 20000 {
		// Keys crowd a few home slots so probe runs wrap and shift.
		h := uint64(round%97)*128 + uint64(round%5) + uint64(round/97)<<20
		if m.get(h) == nil {
			m.put(h, x)
		}
		if m.len() > 50 {
			t.Fatalf("round %d: %d entries", round, m.len())
		}
		if m.get(h) == nil {
			t.Fatalf("round %d: %x missing right after put", round, h)
		}
		for i := range m.slots {
			if e := &m.slots[i]; e.used && m.find(e.key) != i {
				t.Fatalf("round %d: %x unreachable at slot %d", round, e.key, i)
			}
		}
	}
}

// TestUnregisteredHeartbeatsArePruned: heartbeats of replicas that never
// register (or were removed) cannot grow the load view without bound.
func TestUnregisteredHeartbeatsArePruned(t *testing.T) {
	r := New(Config{})
	r.SetTable(table.NewSnapshot())
	now := time.Unix(1000, 0)
	for i := range 5000 {
		now = now.Add(10 * time.Millisecond)
		r.ObserveHeartbeat(&subjects.Heartbeat{Replica: "ghost-" + string(rune('a'+i%26)) + time.Duration(i).String()}, now)
	}
	// Heartbeats stay for dead_after (15 s = 1500 of them); a sweep runs
	// when the map has doubled since the last one.
	if n := len(r.view.replicas); n > 2*1500+64 {
		t.Fatalf("%d replicas kept", n)
	}
}
