package kvindex_test

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/switchyard-llm/switchyard/broker/policy/kvindex"
	"github.com/switchyard-llm/switchyard/subjects"
)

func holders(x *kvindex.Index, model string, key uint64) []kvindex.ID {
	var ids []kvindex.ID
	x.Holders(model, key, func(id kvindex.ID) bool { ids = append(ids, id); return true })
	slices.Sort(ids)
	return ids
}

func upd(replica string, seq uint64, reset bool, stored, evicted []uint64) *subjects.KVUpdate {
	return &subjects.KVUpdate{Replica: replica, Model: "m", Seq: seq, Reset: reset, KVBlocks: 1000, Stored: stored, Evicted: evicted}
}

func TestStoredEvictedExactly(t *testing.T) {
	x := kvindex.New()
	mustApply(t, x, upd("a", 1, true, []uint64{1, 2, 3}, nil))
	mustApply(t, x, upd("b", 1, true, []uint64{2}, nil))
	a, b := x.ID("a"), x.ID("b")
	if got := holders(x, "m", 2); !slices.Equal(got, []kvindex.ID{a, b}) {
		t.Fatalf("holders of 2 = %v, want a and b", got)
	}
	mustApply(t, x, upd("a", 2, false, nil, []uint64{2}))
	if got := holders(x, "m", 2); !slices.Equal(got, []kvindex.ID{b}) {
		t.Fatalf("after a evicted 2: %v, want b", got)
	}
	if x.Holds("other-model", 1, a) || len(holders(x, "other-model", 1)) != 0 {
		t.Fatal("a key of m answered for another model")
	}
	if x.Keys("a") != 2 || x.ModelKeys("m") != 3 {
		t.Fatalf("keys a=%d model=%d", x.Keys("a"), x.ModelKeys("m"))
	}
}

// A flood of stored keys cannot grow a replica past its declared capacity.
func TestCapacityBoundsAFlood(t *testing.T) {
	x := kvindex.New()
	u := upd("a", 1, true, nil, nil)
	u.KVBlocks = 100
	for k := range uint64(subjects.MaxKVUpdateKeys) {
		u.Stored = append(u.Stored, k)
	}
	if err := x.Apply(u); !errors.Is(err, kvindex.ErrBounds) {
		t.Fatalf("err = %v, want ErrBounds", err)
	}
	if x.Keys("a") != 100 {
		t.Fatalf("a holds %d keys, capacity 100", x.Keys("a"))
	}
	u = upd("a", 2, false, []uint64{1}, nil)
	u.Stored = append(u.Stored, make([]uint64, subjects.MaxKVUpdateKeys)...)
	if err := x.Apply(u); !errors.Is(err, kvindex.ErrBounds) {
		t.Fatalf("oversized update: err = %v", err)
	}
	for _, kb := range []int{0, -1, subjects.MaxKVBlocks + 1} {
		u := upd("c", 1, true, []uint64{1}, nil)
		u.KVBlocks = kb
		if err := x.Apply(u); !errors.Is(err, kvindex.ErrBounds) || x.Keys("c") != 0 {
			t.Fatalf("kv_blocks %d: err %v, %d keys", kb, err, x.Keys("c"))
		}
	}
}

// A missed update voids the replica's keys until its adapter resets them.
func TestMissedUpdateDropsUntilReset(t *testing.T) {
	x := kvindex.New()
	mustApply(t, x, upd("a", 1, true, []uint64{1}, nil))
	if err := x.Apply(upd("a", 3, false, []uint64{2}, nil)); !errors.Is(err, kvindex.ErrSeq) {
		t.Fatalf("err = %v, want ErrSeq", err)
	}
	if x.Keys("a") != 0 || x.Synced("a") {
		t.Fatalf("after a gap: %d keys, synced %v", x.Keys("a"), x.Synced("a"))
	}
	if err := x.Apply(upd("a", 4, false, []uint64{2}, nil)); !errors.Is(err, kvindex.ErrSeq) {
		t.Fatalf("before the reset: err = %v", err)
	}
	mustApply(t, x, upd("a", 5, true, []uint64{7}, nil))
	if !x.Synced("a") || !x.Holds("m", 7, x.ID("a")) || x.Holds("m", 1, x.ID("a")) {
		t.Fatal("the reset did not restore exactly its keys")
	}
}

// The table against a map, through growth and deletions.
func TestTableAgainstAMap(t *testing.T) {
	x := kvindex.New()
	rng := rand.New(rand.NewPCG(1, 2))
	names := []string{"r0", "r1", "r2", "r3", "r4"}
	want := map[string]map[uint64]bool{}
	seq := map[string]uint64{}
	for _, n := range names {
		want[n] = map[uint64]bool{}
	}
	for range 400 {
		n := names[rng.IntN(len(names))]
		seq[n]++
		u := &subjects.KVUpdate{Replica: n, Model: "m", Seq: seq[n], Reset: seq[n] == 1, KVBlocks: 1 << 20}
		for range rng.IntN(200) {
			k := rng.Uint64N(3000)
			if rng.IntN(3) == 0 {
				u.Evicted = append(u.Evicted, k)
			} else {
				u.Stored = append(u.Stored, k)
			}
		}
		mustApply(t, x, u)
		for _, k := range u.Evicted {
			delete(want[n], k)
		}
		for _, k := range u.Stored {
			want[n][k] = true
		}
	}
	total := 0
	for _, n := range names {
		total += len(want[n])
		if x.Keys(n) != len(want[n]) {
			t.Fatalf("%s: %d keys, want %d", n, x.Keys(n), len(want[n]))
		}
		for k := range uint64(3000) {
			if x.Holds("m", k, x.ID(n)) != want[n][k] {
				t.Fatalf("%s key %d: holds %v, want %v", n, k, !want[n][k], want[n][k])
			}
		}
	}
	if x.Len() != total {
		t.Fatalf("Len %d, want %d", x.Len(), total)
	}
	x.Remove("r0")
	if x.Len() != total-len(want["r0"]) || x.ID("r0") != 0 {
		t.Fatal("Remove left r0's keys")
	}
}

func mustApply(t *testing.T, x *kvindex.Index, u *subjects.KVUpdate) {
	t.Helper()
	if err := x.Apply(u); err != nil {
		t.Fatal(err)
	}
}

// A resend a decider asked for changes nothing for an index that saw every
// update before it, but its evictions; one that missed updates starts the
// replica over from it.
func TestResendKeepsWhatASyncedIndexHolds(t *testing.T) {
	resend := func(seq uint64, stored, evicted []uint64) *subjects.KVUpdate {
		u := upd("a", seq, true, stored, evicted)
		u.Resend = true
		return u
	}
	x := kvindex.New()
	mustApply(t, x, upd("a", 1, true, []uint64{1, 2, 3}, nil))
	mustApply(t, x, upd("a", 2, false, []uint64{4}, nil))
	mustApply(t, x, resend(3, []uint64{1, 3, 4}, []uint64{2}))
	a := x.ID("a")
	for k, want := range map[uint64]bool{1: true, 2: false, 3: true, 4: true} {
		if x.Holds("m", k, a) != want {
			t.Errorf("synced: holds %d = %v, want %v", k, !want, want)
		}
	}
	if x.Keys("a") != 3 {
		t.Errorf("synced: a holds %d keys, want 3", x.Keys("a"))
	}

	// Another index missed update 2: the resend is all it holds of a.
	y := kvindex.New()
	mustApply(t, y, upd("a", 1, true, []uint64{1, 2, 3, 9}, nil))
	mustApply(t, y, resend(3, []uint64{1, 3, 4}, []uint64{2}))
	a = y.ID("a")
	for k, want := range map[uint64]bool{1: true, 2: false, 3: true, 4: true, 9: false} {
		if y.Holds("m", k, a) != want {
			t.Errorf("behind: holds %d = %v, want %v", k, !want, want)
		}
	}
}
