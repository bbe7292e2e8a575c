package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/switchyard-llm/switchyard/internal/stages"
	"github.com/switchyard-llm/switchyard/loadgen"
)

// The three paths, in the order they are measured and reported; direct is
// the reference.
var pathNames = []string{"direct", "proxy", "switchyard"}

// fixedPhase is one fixed-rate run of the three paths, interleaved.
type fixedPhase struct {
	Report *loadgen.Report `json:"report"`
	// PerPath is the requests each path got, warmup included: the
	// denominator of the CPU figures.
	PerPath int `json:"per_path"`
	// CPU is the CPU time each process used during the phase; the engine
	// served all three paths, the generator sent to all three.
	CPU map[string]cpuUse `json:"cpu"`
	// Load is the 1-minute load average the phase started at; Stages its
	// stage table.
	Load   float64         `json:"loadavg_start"`
	Stages *stages.Summary `json:"stages,omitempty"`
	// Floor is the nats-floor role alone at the same rate, after the
	// paths (non-stream only).
	Floor *floorPhase `json:"floor,omitempty"`
}

// step is one path alone at one rate.
type step struct {
	Rate      float64     `json:"rate"`
	Path      string      `json:"path"`
	P50       loadgen.Dur `json:"p50_ms"`
	P99       loadgen.Dur `json:"p99_ms"`
	ErrorRate float64     `json:"error_rate"`
	SendLag   loadgen.Dur `json:"send_lag_p99_ms"`
	Held      bool        `json:"held"`
	Why       string      `json:"why,omitempty"`
}

type results struct {
	Machine     machine     `json:"machine"`
	Config      configJSON  `json:"config"`
	NonStream   *fixedPhase `json:"non_stream"`
	Stream      *fixedPhase `json:"stream"`
	Bodies      []bodySize  `json:"bodies,omitempty"`
	Concurrency *concPhase  `json:"concurrency,omitempty"`
	Steps       []step      `json:"steps"`
	StepsLoad   float64     `json:"steps_loadavg_start"`
	// MaxHeld is the highest step each path held (0: none); StepsEnded
	// says why stepping stopped early for a path, if it did.
	MaxHeld map[string]float64 `json:"max_held"`
	// Overload is Switchyard at twice the rate it held (overload.go).
	Overload     *overloadPhase    `json:"overload,omitempty"`
	StepsEnded   map[string]string `json:"steps_ended,omitempty"`
	Many         *manyPhase        `json:"many,omitempty"`
	ProfileTop   string            `json:"profile_top,omitempty"`
	ProfileParts []profilePart     `json:"profile_parts,omitempty"`
	// Decide is BenchmarkDecide/candidates=64 (--decide-bench).
	Decide  *decideBench `json:"decide,omitempty"`
	Elapsed loadgen.Dur  `json:"elapsed_ms"`
}

type configJSON struct {
	Model        string      `json:"model"`
	TTFT         loadgen.Dur `json:"ttft_ms"`
	ITL          loadgen.Dur `json:"itl_ms"`
	MaxTokens    int         `json:"max_tokens"`
	Rate         float64     `json:"rate"`
	Duration     loadgen.Dur `json:"duration_ms"`
	Warmup       loadgen.Dur `json:"warmup_ms"`
	StepDuration loadgen.Dur `json:"step_duration_ms"`
	StepBisect   int         `json:"step_bisect"`
	P99Limit     loadgen.Dur `json:"p99_limit_ms"`
	MaxBatch     int         `json:"replica_max_batch"`
	MaxQueue     int         `json:"replica_max_queue"`
}

type bench struct {
	cfg    config
	start  time.Time
	client *http.Client
	urls   []string // per path
	procs  map[string]*child
	ctlURL string
	// floorURL is the nats-floor role's control ("" when the stack
	// serves no control listener).
	floorURL string
	results  results
}

func orchestrate(ctx context.Context, cfg config) (err error) {
	b := &bench{cfg: cfg, start: time.Now(), client: loadgen.NewClient(), procs: map[string]*child{}}
	defer b.client.CloseIdleConnections()
	b.results.Machine = describeMachine()
	b.results.Config = configJSON{Model: cfg.model, TTFT: loadgen.Dur(cfg.ttft), ITL: loadgen.Dur(cfg.itl), MaxTokens: cfg.maxTokens,
		Rate: cfg.rate, Duration: loadgen.Dur(cfg.duration), Warmup: loadgen.Dur(cfg.warmup),
		StepDuration: loadgen.Dur(cfg.stepDuration), StepBisect: cfg.stepBisect, P99Limit: loadgen.Dur(cfg.p99Limit),
		MaxBatch: cfg.maxBatch, MaxQueue: cfg.maxQueue}
	defer func() {
		for _, c := range b.procs {
			if serr := c.stop(); serr != nil && err == nil {
				err = fmt.Errorf("%s stopped with an error: %w", c.name, serr)
			}
		}
	}()
	if cfg.onlyMany {
		// The other phases' results are kept from the --json of the last
		// full run, when there is one; the document's section of the
		// phase is rewritten alone.
		if prev, err := os.ReadFile(cfg.jsonOut); err == nil && cfg.jsonOut != "" {
			if err := json.Unmarshal(prev, &b.results); err != nil {
				return fmt.Errorf("%s: %w", cfg.jsonOut, err)
			}
		}
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		if b.results.Many, err = b.many(ctx, exe); err != nil {
			return err
		}
		if cfg.jsonOut != "" {
			if err := writeJSON(cfg.jsonOut, &b.results); err != nil {
				return err
			}
		}
		// The phase's own verdicts: the others' are the earlier run's.
		printVerdicts(&results{Many: b.results.Many})
		return writeManySection(cfg.out, b.results.Many)
	}
	if cfg.decidePkg != "" {
		if b.results.Decide, err = b.runDecideBench(ctx, cfg.decidePkg); err != nil {
			return err
		}
	}
	if err := b.startPaths(ctx); err != nil {
		return err
	}
	if err := b.check(ctx); err != nil {
		return err
	}
	if b.results.NonStream, err = b.fixed(ctx, false, cfg.cpuProfile); err != nil {
		return err
	}
	if b.floorURL != "" {
		// Without the floor the CPU target has no verdict; the other
		// phases are measured all the same.
		if b.results.NonStream.Floor, err = b.floorFixed(ctx); err != nil {
			if ctx.Err() != nil {
				return err
			}
			fmt.Fprintln(os.Stderr, "nats-floor alone:", err)
		}
	}
	if b.results.Stream, err = b.fixed(ctx, true, ""); err != nil {
		return err
	}
	if len(cfg.bodyKB) > 0 {
		if b.results.Bodies, err = b.bodySizes(ctx); err != nil {
			return err
		}
	}
	if cfg.concurrency > 0 {
		if b.results.Concurrency, err = b.concurrent(ctx); err != nil {
			return err
		}
	}
	if err := b.stepUp(ctx); err != nil {
		return err
	}
	if b.results.Overload, err = b.overload(ctx); err != nil {
		return err
	}
	if len(cfg.many.rates) > 0 {
		// The first paths are idle from here on; stopped, they neither
		// take memory nor answer anything.
		for name, c := range b.procs {
			if serr := c.stop(); serr != nil {
				return fmt.Errorf("%s stopped with an error: %w", c.name, serr)
			}
			delete(b.procs, name)
		}
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		if b.results.Many, err = b.many(ctx, exe); err != nil {
			return err
		}
	}
	b.results.Elapsed = loadgen.Dur(time.Since(b.start))
	if cfg.cpuProfile != "" {
		b.results.ProfileTop = profileTop(cfg.cpuProfile)
		b.results.ProfileParts = profileParts(cfg.cpuProfile)
	}
	if cfg.jsonOut != "" {
		if err := writeJSON(cfg.jsonOut, &b.results); err != nil {
			return err
		}
	}
	if err := writeSection(cfg.out, render(&b.results)); err != nil {
		return err
	}
	printVerdicts(&b.results)
	if b.results.Many != nil {
		if err := writeManySection(cfg.out, b.results.Many); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "wrote %s in %s\n", cfg.out, time.Since(b.start).Round(time.Second))
	return nil
}

func (b *bench) startPaths(ctx context.Context) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	common := []string{"-model", b.cfg.model, "-ttft", b.cfg.ttft.String(), "-itl", b.cfg.itl.String(),
		"-max-batch", strconv.Itoa(b.cfg.maxBatch), "-max-queue", strconv.Itoa(b.cfg.maxQueue)}
	eng, err := startChild(ctx, exe, "engine", append([]string{"-role", "engine"}, common...)...)
	if err != nil {
		return err
	}
	b.procs["engine"] = eng
	for _, role := range []string{"proxy", "stack"} {
		c, err := startChild(ctx, exe, role, append([]string{"-role", role, "-engine", eng.urls[0]}, common...)...)
		if err != nil {
			return err
		}
		b.procs[role] = c
	}
	b.urls = []string{eng.urls[0], b.procs["proxy"].urls[0], b.procs["stack"].urls[0]}
	if len(b.procs["stack"].urls) > 1 {
		b.ctlURL = b.procs["stack"].urls[1]
	}
	if err := b.startFloor(ctx, exe); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "engine %s, proxy %s, switchyard %s, nats-floor %s\n", b.urls[0], b.urls[1], b.urls[2], b.floorURL)
	return nil
}

func (b *bench) load(ctx context.Context, targets, names []string, rate float64, d, warmup time.Duration, stream bool, progress io.Writer) (*loadgen.Report, error) {
	// An overloaded step leaves thousands of idle connections behind; they
	// would hold their descriptors into the next step.
	defer b.client.CloseIdleConnections()
	return loadgen.Run(ctx, loadgen.Config{
		Targets: targets, Names: names, Rate: rate, Duration: d, Warmup: warmup,
		Stream: stream, MaxTokens: b.cfg.maxTokens, Model: b.cfg.model,
		Timeout: 5 * time.Second, Progress: progress, Client: b.client,
	})
}

// check sends a few requests down every path, streamed and not: a path that
// fails them would make every figure after meaningless.
func (b *bench) check(ctx context.Context) error {
	for _, stream := range []bool{false, true} {
		rep, err := loadgen.Run(ctx, loadgen.Config{
			Targets: b.urls, Names: pathNames, Rate: 20, Requests: 10, Stream: stream,
			MaxTokens: b.cfg.maxTokens, Model: b.cfg.model, Timeout: 5 * time.Second, Client: b.client,
		})
		if err != nil {
			return err
		}
		for _, t := range rep.Targets {
			if t.Errors > 0 {
				return fmt.Errorf("path %s fails before the benchmark (stream %v): %v", t.Name, stream, t.ErrorsBy)
			}
		}
	}
	return nil
}

// fixed runs the three paths interleaved at the fixed rate, reading each
// process's CPU time around it and, when asked, profiling Switchyard.
func (b *bench) fixed(ctx context.Context, stream bool, profile string) (*fixedPhase, error) {
	fmt.Fprintf(os.Stderr, "== fixed rate %g/s per path, stream %v, %s\n", b.cfg.rate, stream, b.cfg.duration)
	var wg sync.WaitGroup
	var profErr error
	if profile != "" && b.ctlURL != "" {
		secs := int((b.cfg.warmup + b.cfg.duration).Seconds())
		wg.Go(func() { profErr = fetchProfile(ctx, b.ctlURL, secs, profile) })
	}
	load := b.settle(ctx)
	b.resetStages(ctx, b.ctlURL)
	before := b.cpu()
	rep, err := b.load(ctx, b.urls, pathNames, b.cfg.rate, b.cfg.duration, b.cfg.warmup, stream, os.Stderr)
	after := b.cpu()
	wg.Wait()
	if err != nil {
		return nil, err
	}
	if profErr != nil {
		fmt.Fprintln(os.Stderr, "cpu profile:", profErr)
	}
	_ = rep.WriteText(os.Stderr)
	ph := &fixedPhase{Report: rep, CPU: map[string]cpuUse{}, PerPath: rep.Requests + int(b.cfg.rate*b.cfg.warmup.Seconds()),
		Load: load, Stages: b.stageTable(ctx, b.ctlURL)}
	for k, v := range after {
		ph.CPU[k] = v.minus(before[k])
	}
	return ph, nil
}

// cpu reads every process's CPU time, the generator's (this process) too.
func (b *bench) cpu() map[string]cpuUse {
	m := map[string]cpuUse{}
	for name, c := range b.procs {
		if d, err := c.cpuTime(); err == nil {
			m[name] = d
		}
	}
	if d, err := cpuTimeOf(os.Getpid()); err == nil {
		m["generator"] = d
	}
	return m
}

// stepUp raises the rate step by step, each path alone, until each fails a
// step or the budget runs out; a path that fails a step is then tried
// between the last rate it held and the one it failed, --step-bisect
// times, so its capacity is not off by a whole step.
func (b *bench) stepUp(ctx context.Context) error {
	r := &b.results
	r.MaxHeld, r.StepsEnded = map[string]float64{}, map[string]string{}
	r.StepsLoad = b.settle(ctx)
	alive := map[string]bool{}
	for _, p := range pathNames {
		alive[p] = true
	}
	per := b.cfg.stepDuration + b.cfg.stepWarmup + time.Second
	outOfTime := func(rate float64) bool {
		if time.Since(b.start)+per <= b.cfg.budget {
			return false
		}
		for _, q := range pathNames {
			if alive[q] {
				r.StepsEnded[q] = fmt.Sprintf("time budget of %s reached before %g/s", b.cfg.budget, rate)
				alive[q] = false
			}
		}
		return true
	}
	try := func(i int, p string, rate float64) (bool, error) {
		rep, err := b.load(ctx, b.urls[i:i+1], []string{p}, rate, b.cfg.stepDuration, b.cfg.stepWarmup, false, nil)
		if err != nil {
			return false, err
		}
		s := judge(rate, p, &rep.Targets[0], b.cfg.p99Limit)
		fmt.Fprintf(os.Stderr, "step %6g/s %-10s p50 %7.2fms p99 %7.2fms errors %.2f%% lag p99 %.2fms %s\n",
			rate, p, s.P50.Ms(), s.P99.Ms(), 100*s.ErrorRate, s.SendLag.Ms(), s.Why)
		r.Steps = append(r.Steps, s)
		if s.Held && rate > r.MaxHeld[p] {
			r.MaxHeld[p] = rate
		}
		return s.Held, nil
	}
	for _, rate := range b.cfg.steps {
		for i, p := range pathNames {
			if !alive[p] {
				continue
			}
			if outOfTime(rate) {
				return nil
			}
			held, err := try(i, p, rate)
			if err != nil || held {
				if err != nil {
					return err
				}
				continue
			}
			alive[p] = false
			// Between the last rate held and the one failed.
			low, high := r.MaxHeld[p], rate
			for range b.cfg.stepBisect {
				mid := math.Round((low+high)/2/50) * 50
				if low == 0 || mid <= low || mid >= high || outOfTime(mid) {
					break
				}
				ok, err := try(i, p, mid)
				if err != nil {
					return err
				}
				if ok {
					low = mid
				} else {
					high = mid
				}
			}
		}
	}
	for _, p := range pathNames {
		if alive[p] {
			r.StepsEnded[p] = "held every step tried"
		}
	}
	return nil
}

// judge says whether a path held a rate: p99 under the limit and at most
// 0.1% errors.
func judge(rate float64, path string, t *loadgen.TargetReport, limit time.Duration) step {
	s := step{Rate: rate, Path: path, P50: t.Latency.P50, P99: t.Latency.P99, ErrorRate: t.ErrorRate(), SendLag: t.SendLag.P99}
	var why []string
	if t.OK == 0 {
		why = append(why, "no request succeeded")
	} else if t.Latency.P99.D() >= limit {
		why = append(why, fmt.Sprintf("p99 %.1fms ≥ %s", t.Latency.P99.Ms(), limit))
	}
	if s.ErrorRate > 0.001 {
		why = append(why, fmt.Sprintf("errors %.2f%% %v", 100*s.ErrorRate, t.ErrorsBy))
	}
	s.Held = len(why) == 0
	s.Why = strings.Join(why, "; ")
	return s
}

func fetchProfile(ctx context.Context, ctlURL string, secs int, path string) error {
	return fetchTo(ctx, fmt.Sprintf("%s/cpu?seconds=%d", ctlURL, secs), path)
}

// fetchTo writes what url answers to path.
func fetchTo(ctx context.Context, url, path string) error {
	rc, err := fetch(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	defer rc.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, rc)
	return errors.Join(err, f.Close())
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
