// Command benche2e measures what Switchyard adds to a request. In one run
// it starts an engine simulator with a fixed fast answer, a plain
// httputil.ReverseProxy in front of it and the Switchyard stack in front of
// it, each in its own process, then loads the three paths from this
// process: at a fixed rate, interleaved, streamed and not; with long
// prompts, one at a time over body sizes and many at once; then step by
// step to find the highest rate each holds. Beside them the bus floor
// (the nats-floor role, floor.go) sends the same messages as Switchyard's
// two legs through the same NATS server and does nothing else: what the
// bus itself costs, which Switchyard's figures are judged against. It
// prints one verdict line per target, and writes its section of
// docs/benchmarks.md between markers, leaving the rest of the file alone.
//
// `make bench-e2e` runs it (scripts/bench-e2e.sh).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type config struct {
	out, jsonOut, cpuProfile string

	model     string
	ttft, itl time.Duration
	maxTokens int

	maxBatch, maxQueue int

	rate             float64
	duration, warmup time.Duration

	steps        []float64
	stepDuration time.Duration
	stepBisect   int
	stepWarmup   time.Duration
	p99Limit     time.Duration
	budget       time.Duration

	bodyKB       []int
	bodyRounds   int
	concurrency  int
	concKB       int
	concDuration time.Duration
	concWarmup   time.Duration
	many         manyConfig
	onlyMany     bool
	decidePkg    string
	settleMax    time.Duration
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "benche2e:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("benche2e", flag.ContinueOnError)
	var cfg config
	var rc roleConfig
	role := fs.String("role", "", "internal: run one process of the benchmark (engine, proxy, stack, nats-floor or busy)")
	fs.StringVar(&rc.engineURL, "engine", "", "internal: the engine's URL, for the proxy and stack roles")
	fs.StringVar(&rc.floor, "floor", "", "internal: where the nats-floor role connects (JSON, from the stack role's /floor)")
	fs.StringVar(&cfg.out, "out", "docs/benchmarks.md", "Markdown file whose bench-e2e section is (re)written")
	fs.StringVar(&cfg.jsonOut, "json", "", "also write every raw report as JSON here")
	fromJSON := fs.String("from-json", "", "measure nothing: rewrite the section of --out from a --json file of an earlier run")
	fs.StringVar(&cfg.cpuProfile, "cpuprofile", "", "CPU profile of the Switchyard process during the non-stream fixed-rate phase")
	fs.StringVar(&cfg.model, "model", "llama-3-8b-instruct", "model served by the engine and asked for")
	fs.DurationVar(&cfg.ttft, "ttft", 2*time.Millisecond, "engine time to first token")
	fs.DurationVar(&cfg.itl, "itl", 500*time.Microsecond, "engine time between tokens")
	fs.IntVar(&cfg.maxTokens, "max-tokens", 8, "tokens per answer")
	// The replica declares the dev capacity: the broker's admission is part
	// of what is measured.
	fs.IntVar(&rc.maxBatch, "max-batch", 32, "max_batch the Switchyard replica declares")
	fs.IntVar(&rc.maxQueue, "max-queue", 128, "max_queue the Switchyard replica declares")
	fs.Float64Var(&cfg.rate, "rate", 500, "requests/s per path in the fixed-rate phases")
	fs.DurationVar(&cfg.duration, "duration", 20*time.Second, "length of each fixed-rate phase")
	fs.DurationVar(&cfg.warmup, "warmup", 2*time.Second, "warmup before each fixed-rate phase")
	steps := fs.String("steps", "500,1000,2000,3000,4000,5000,6000,8000,10000,12000", "rates tried, in order, for the highest rate held")
	fs.DurationVar(&cfg.stepDuration, "step-duration", 5*time.Second, "length of each step")
	fs.IntVar(&cfg.stepBisect, "step-bisect", 2, "after a path fails a step, this many more steps between the last rate it held and the one it failed (0: none)")
	fs.DurationVar(&cfg.stepWarmup, "step-warmup", time.Second, "warmup before each step")
	fs.DurationVar(&cfg.p99Limit, "p99", 50*time.Millisecond, "a step is held when p99 is under this and errors ≤ 0.1%")
	fs.DurationVar(&cfg.budget, "budget", 5*time.Minute, "stop stepping when the run would exceed this")
	bodyKB := fs.String("body-kb", "1,16,64,128,256,480", "prompt body sizes in KB for the one-at-a-time phase (empty: skip it)")
	fs.IntVar(&cfg.bodyRounds, "body-rounds", 60, "requests per path and body size in the one-at-a-time phase")
	fs.IntVar(&cfg.concurrency, "concurrency", 20, "requests in flight in the long-prompt concurrency phase (0: skip it)")
	fs.IntVar(&cfg.concKB, "conc-kb", 220, "prompt body size in KB in the concurrency phase")
	fs.DurationVar(&cfg.concDuration, "conc-duration", 10*time.Second, "length of the concurrency phase")
	fs.DurationVar(&cfg.concWarmup, "conc-warmup", 2*time.Second, "warmup before the concurrency phase")
	manyRates := fs.String("many-rates", "150,300", "new streams/s per path in the many-streams phase, in order (empty: no phase)")
	fs.IntVar(&cfg.many.tokens, "many-tokens", 100, "tokens per answer in the many-streams phase")
	fs.DurationVar(&cfg.many.ttft, "many-ttft", 50*time.Millisecond, "engine time to first token in the many-streams phase")
	fs.DurationVar(&cfg.many.itl, "many-itl", 100*time.Millisecond, "engine time between tokens in the many-streams phase")
	fs.DurationVar(&cfg.many.duration, "many-duration", 15*time.Second, "length of each rate of the many-streams phase")
	fs.DurationVar(&cfg.many.warmup, "many-warmup", 3*time.Second, "warmup before each rate of the many-streams phase")
	fs.IntVar(&cfg.many.busy, "many-busy", 3, "after the rates, the last rate once more with this many busy loops (a process of their own) spinning beside the stack for the whole step (0: no such step)")
	fs.IntVar(&cfg.many.capacity, "many-capacity", 8192, "max_batch and max_queue of the replica in the many-streams phase")
	fs.DurationVar(&cfg.settleMax, "settle", 3*time.Minute, "before each phase, wait up to this long for the 1-minute load average to fall to 1.0, so the bench's own previous phase does not make the next one indicative (0: do not wait)")
	fs.StringVar(&cfg.decidePkg, "decide-bench", "", "first run BenchmarkDecide/candidates=64 of this package with `go test` ($GO), five times, and judge it (empty: skip)")
	fs.BoolVar(&cfg.onlyMany, "only-many", false, "run the many-streams phase alone: rewrite its own section of --out (and its part of --json)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	for _, s := range strings.Split(*manyRates, ",") {
		if strings.TrimSpace(s) == "" {
			continue
		}
		r, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || r <= 0 || r > 10000 {
			return fmt.Errorf("bad --many-rates entry %q", s)
		}
		cfg.many.rates = append(cfg.many.rates, r)
	}
	if cfg.many.tokens < 1 || cfg.many.tokens > 100000 || cfg.many.capacity < 1 {
		return fmt.Errorf("--many-tokens and --many-capacity must be positive")
	}
	if cfg.many.busy < 0 || cfg.many.busy > 64 {
		return fmt.Errorf("--many-busy must be from 0 to 64")
	}
	rc.busyLoops = cfg.many.busy
	if cfg.onlyMany && len(cfg.many.rates) == 0 {
		return fmt.Errorf("--only-many needs --many-rates")
	}
	rc.model, rc.ttft, rc.itl = cfg.model, cfg.ttft, cfg.itl
	cfg.maxBatch, cfg.maxQueue = rc.maxBatch, rc.maxQueue
	if *role != "" {
		return runRole(ctx, *role, rc)
	}
	if *fromJSON != "" {
		return rerender(*fromJSON, cfg.out)
	}
	if *bodyKB != "" {
		kb, err := parseKB(*bodyKB)
		if err != nil {
			return fmt.Errorf("--body-kb: %w", err)
		}
		cfg.bodyKB = kb
	}
	if cfg.stepBisect < 0 || cfg.stepBisect > 8 {
		return fmt.Errorf("--step-bisect must be from 0 to 8")
	}
	if cfg.bodyRounds <= 0 {
		return fmt.Errorf("--body-rounds must be positive")
	}
	for _, s := range strings.Split(*steps, ",") {
		r, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || r <= 0 {
			return fmt.Errorf("bad --steps entry %q", s)
		}
		cfg.steps = append(cfg.steps, r)
	}
	return orchestrate(ctx, cfg)
}
