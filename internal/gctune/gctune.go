// Package gctune sets the garbage collector for a router process. A router
// keeps a small live heap (tables, prefix maps, buffers: about 13 MiB under
// load) and allocates per request, so with Go's default GOGC=100 it collects
// very often, and the collector becomes a large share of the router's CPU
// (docs/benchmarks.md, "Targets and where the time goes"). A higher target
// trades a few tens of MiB for far fewer collections.
//
// Only a few tens: thousands of open streams make the live heap larger
// (each holds buffers, a goroutine and its state), and at GOGC=400 the heap
// would grow to five times that. So the target follows the live heap: the
// room it gives above the live heap is at most Headroom, and never less
// than Go's default GOGC=100.
package gctune

import (
	"os"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// Percent is the highest GOGC the switchyard binary runs with unless GOGC is
// set (the target with a small live heap).
const Percent = 400

// Headroom is the most the target lets the heap grow above the live heap
// before a collection, while that is above GOGC=100.
const Headroom = 64 << 20

// every is how often the live heap is read.
const every = 500 * time.Millisecond

// PercentFor is the GOGC for a live heap of live bytes: Headroom above it,
// between 100 and Percent.
func PercentFor(live uint64) int {
	if live == 0 {
		return Percent
	}
	return int(min(max(Headroom*100/live, 100), Percent))
}

// Start applies Percent and then follows the live heap (PercentFor) from a
// goroutine of its own until stop is called (stop may be called more than
// once); nothing when the operator set GOGC in the environment.
func Start() (stop func()) {
	if os.Getenv("GOGC") != "" {
		return func() {}
	}
	debug.SetGCPercent(Percent)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		current := Percent
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			metrics.Read(sample)
			if sample[0].Value.Kind() != metrics.KindUint64 {
				continue
			}
			if p := PercentFor(sample[0].Value.Uint64()); p != current {
				debug.SetGCPercent(p)
				current = p
			}
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() { close(done) })
		wg.Wait()
	}
}
