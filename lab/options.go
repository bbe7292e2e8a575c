package lab

import (
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/switchyard-llm/switchyard/enginesim"
)

// Scale sets how much each experiment simulates.
type Scale int

// Scales: Full for the report, Quick for a faster look, Tiny for tests.
const (
	Full Scale = iota
	Quick
	Tiny
)

func (s Scale) String() string {
	switch s {
	case Full:
		return "full"
	case Quick:
		return "quick"
	case Tiny:
		return "tiny"
	}
	return fmt.Sprintf("Scale(%d)", int(s))
}

// Options are the inputs of an experiment.
type Options struct {
	Scale Scale
	// Seed makes the run reproducible: the same seed, the same numbers.
	Seed uint64
	// Workers is how many simulations run at once (default GOMAXPROCS).
	// Results do not depend on it.
	Workers int
}

// pick chooses a value by scale.
func pick[T any](o Options, full, quick, tiny T) T {
	switch o.Scale {
	case Quick:
		return quick
	case Tiny:
		return tiny
	}
	return full
}

// seed derives the seed of one run from the options' seed, so that
// experiments and repetitions draw independent streams.
func (o Options) seed(parts ...uint64) uint64 {
	h := o.Seed*0x9e3779b97f4a7c15 + 0x632be59bd9b4e019
	for _, p := range parts {
		h = mix(h ^ p)
	}
	return h
}

func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Profile is the replica model every experiment starts from: a 70B-class
// model on one node, scaled so runs stay small. A decode step takes 25 ms
// plus 0.4 ms per extra running request (about 37 ms at a full batch of
// 32); prefill costs 40 ms plus 80 µs per uncached prompt token (a 2000-token
// prompt takes 0.2 s and stalls the batch meanwhile, as without chunked
// prefill); the KV cache holds 4096 blocks of 16 tokens (65 536 tokens);
// each distinct adapter in a batch adds 1 ms to its step, and loading one
// costs 50 ms.
func Profile() enginesim.Config {
	return enginesim.Config{
		Model: ModelID, KVBlocks: 4096, BlockTokens: BlockTokens, MaxBatch: 32, MaxQueue: 128,
		TTFTBase: 40 * time.Millisecond, PrefillPerToken: 80 * time.Microsecond,
		ITL: 25 * time.Millisecond, ITLPerBatch: 400 * time.Microsecond,
		LoraLoad: 50 * time.Millisecond, LoraPerAdapterStep: time.Millisecond,
	}
}

// parallel runs jobs on o.Workers goroutines and returns when all are done.
// Each job writes only its own result slot, so the outcome does not depend
// on scheduling.
func (o Options) parallel(jobs []func()) {
	w := o.Workers
	if w <= 0 {
		w = runtime.GOMAXPROCS(0)
	}
	next := make(chan func())
	var wg sync.WaitGroup
	for range min(w, len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range next {
				j()
			}
		}()
	}
	for _, j := range jobs {
		next <- j
	}
	close(next)
	wg.Wait()
}

// window is a run's span: warm-up then measurement.
type window struct{ warmup, horizon time.Duration }

func (o Options) window(full, quick, tiny time.Duration) window {
	h := pick(o, full, quick, tiny)
	return window{warmup: min(30*time.Second, h/6), horizon: h}
}

// runGrid runs build(i, k) for every configuration i < n and repetition
// k < reps in parallel, and returns the results by [i][k].
func (o Options) runGrid(n, reps int, build func(i, k int) *Scenario) [][]*Result {
	out := make([][]*Result, n)
	var jobs []func()
	for i := range n {
		out[i] = make([]*Result, reps)
		for k := range reps {
			jobs = append(jobs, func() { out[i][k] = Run(build(i, k)) })
		}
	}
	o.parallel(jobs)
	return out
}

// workloads generates one workload per repetition, shared (read-only) by
// every configuration of that repetition so arms are compared on the same
// requests.
func (o Options) workloads(name string, reps int, w func(k int) Workload) [][]*Request {
	out := make([][]*Request, reps)
	var jobs []func()
	for k := range reps {
		jobs = append(jobs, func() { out[k] = w(k).Generate(o.seed(hashName(name), uint64(k))) })
	}
	o.parallel(jobs)
	return out
}

func hashName(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * 1099511628211
	}
	return h
}
