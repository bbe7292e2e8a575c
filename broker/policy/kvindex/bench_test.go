package kvindex_test

import (
	"fmt"
	"runtime"
	"strconv"
	"testing"

	"github.com/switchyard-llm/switchyard/broker/policy/kvindex"
	"github.com/switchyard-llm/switchyard/subjects"
)

// BenchmarkApply: a replica's steady state, each update storing 32 keys
// and evicting 32; ns/key × 50,000 is the share of a core that 50,000 key
// updates a second cost.
func BenchmarkApply(b *testing.B) {
	x := kvindex.New()
	const replicas, held = 64, 20_000
	seqs := make([]uint64, replicas)
	names := make([]string, replicas)
	next := make([]uint64, replicas)
	for r := range replicas {
		names[r] = "r" + strconv.Itoa(r)
		u := &subjects.KVUpdate{Replica: names[r], Model: "m", Seq: 1, Reset: true, KVBlocks: 100_000}
		for k := range uint64(held) {
			u.Stored = append(u.Stored, uint64(r)<<32|k)
			if len(u.Stored) == subjects.MaxKVUpdateKeys {
				must(b, x.Apply(u))
				seqs[r]++
				u = &subjects.KVUpdate{Replica: names[r], Model: "m", Seq: seqs[r] + 1, KVBlocks: 100_000}
			}
		}
		must(b, x.Apply(u))
		seqs[r]++
		next[r] = held
	}
	u := &subjects.KVUpdate{Model: "m", KVBlocks: 100_000, Stored: make([]uint64, 32), Evicted: make([]uint64, 32)}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r := i % replicas
		u.Replica, u.Seq = names[r], seqs[r]+1
		seqs[r]++
		for j := range 32 {
			u.Evicted[j] = uint64(r)<<32 | (next[r] - held + uint64(j))
			u.Stored[j] = uint64(r)<<32 | (next[r] + uint64(j))
		}
		next[r] += 32
		if err := x.Apply(u); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*64), "ns/key")
}

// BenchmarkMemory fills the index for 1,000 replicas whose engines hold
// 100,000 blocks of 16 tokens each: 25,000 request keys per replica at
// the default prefix_block_chars (256 characters, about 64 tokens, a key
// per 4 blocks). It reports the heap the index holds.
func BenchmarkMemory(b *testing.B) {
	const replicas, keys = 1000, 25_000
	for range b.N {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		x := kvindex.New()
		for r := range replicas {
			name := "replica-" + strconv.Itoa(r)
			u := &subjects.KVUpdate{Replica: name, Model: "m", Seq: 1, Reset: true, KVBlocks: 100_000}
			for k := range uint64(keys) {
				// Half of each replica's keys are shared with the others
				// (system prompts), half are its own.
				key := k
				if k%2 == 1 {
					key = uint64(r)<<32 | k
				}
				u.Stored = append(u.Stored, key)
				if len(u.Stored) == subjects.MaxKVUpdateKeys {
					must(b, x.Apply(u))
					u = &subjects.KVUpdate{Replica: name, Model: "m", Seq: u.Seq + 1, KVBlocks: 100_000}
				}
			}
			must(b, x.Apply(u))
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "MiB")
		b.ReportMetric(float64(x.Len()), "entries")
		runtime.KeepAlive(x)
	}
}

func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkResend is what answering a decider's sync costs every other
// decider for one replica of 100 keys, in an index of a million: a resend
// to an index in sync touches that replica's keys, not the whole table.
func BenchmarkResend(b *testing.B) {
	x := kvindex.New()
	for r := range 250 {
		u := &subjects.KVUpdate{Replica: fmt.Sprintf("r-%d", r), Model: "m", Seq: 1, Reset: true, KVBlocks: 1 << 20}
		for k := range 4_000 {
			u.Stored = append(u.Stored, uint64(r)<<32|uint64(k))
		}
		if err := x.Apply(u); err != nil {
			b.Fatal(err)
		}
	}
	u := &subjects.KVUpdate{Replica: "a", Model: "m", Seq: 1, Reset: true, KVBlocks: 1000}
	for k := range 100 {
		u.Stored = append(u.Stored, 1<<40|uint64(k))
	}
	if err := x.Apply(u); err != nil {
		b.Fatal(err)
	}
	u.Resend = true
	for b.Loop() {
		u.Seq++
		if err := x.Apply(u); err != nil {
			b.Fatal(err)
		}
	}
}
