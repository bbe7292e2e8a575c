// Package loadgen is an open-loop load generator for OpenAI-compatible chat
// endpoints on this machine.
//
// Open loop: every request has a send time fixed in advance by the rate,
// and is sent at that time however slow the earlier answers are. Its
// latency is measured from that scheduled time, so a server that stalls is
// charged for the requests that would have been sent during the stall
// (there is no coordinated omission). Several targets are measured in one
// run, interleaved: each target gets the full rate, and the targets take
// turns slot by slot (target k of K is due k/K of an interval after target
// 0), so they share the same time window and the same machine noise.
package loadgen

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard-llm/switchyard/internal/check"
)

// Config describes one run.
type Config struct {
	// Targets are the URLs measured; the first is the reference the others
	// are compared with. A URL with no path gets /v1/chat/completions.
	Targets []string
	// Names label the targets in reports (default "target", "compare1", …).
	Names []string
	// Rate is the requests per second sent to each target.
	Rate float64
	// Duration and Requests bound the measured part of the run, per
	// target: it ends at whichever comes first. At least one is required.
	Duration time.Duration
	Requests int
	// Warmup runs the same schedule for this long before the measured part;
	// its requests are sent but not counted.
	Warmup time.Duration
	// Stream asks for server-sent events and measures the gaps between
	// their data lines.
	Stream    bool
	MaxTokens int    // default 8
	Model     string // default "llama-3-8b-instruct"
	Prompt    string // default a short question
	// Timeout bounds each request from its send (default 30s).
	Timeout time.Duration
	// MaxInFlight caps outstanding requests (default 10000); a slot that
	// finds the cap reached is not sent and counts as an error.
	MaxInFlight int
	// PromptBytes sets the size of each user message (random words; a
	// range is drawn uniformly); zero: Prompt.
	PromptBytes Sizes
	// SharedPrefix opens every request with one of K system prompts of L
	// bytes, chosen with Zipf popularity.
	SharedPrefix SharedPrefix
	// Conversations spreads the requests over this many multi-turn
	// conversations, in turn: each request carries its conversation's
	// history and X-Conversation-Id.
	Conversations int
	// Workload replaces the generated bodies with these, in order (and
	// again from the first when the run outlasts them). Replay sends them
	// at their timestamps instead of at Rate, each once.
	Workload []Entry
	Replay   bool
	// APIKey is sent as Authorization: Bearer.
	APIKey string
	// Concurrency > 0 runs a closed loop instead of the open one: this many
	// requests in flight per target, each sent when the one before it
	// finished; Rate is ignored and latency counts from the actual send.
	Concurrency int
	// Seed makes the generated prompts, prefixes and choices repeatable.
	Seed int64
	// Progress receives one line a second while the run lasts (nil: none).
	Progress io.Writer
	// Client sends the requests (nil: NewClient()).
	Client *http.Client
}

// Configuration errors.
var (
	ErrNoTargets = errors.New("loadgen: no target")
	ErrBadRate   = errors.New("loadgen: rate must be positive")
	ErrUnbounded = errors.New("loadgen: a duration or a request count is required")
)

// maxSlots bounds the memory a run may take (one record per request).
const maxSlots = 20_000_000

// Validate range-checks c before anything is sent. Zero values stand for
// their defaults; errors name the flag that sets the value.
func (c *Config) Validate() error {
	var errs []error
	if len(c.Targets) == 0 {
		errs = append(errs, fmt.Errorf("--target: %w", ErrNoTargets))
	}
	if !(c.Rate > 0) && !c.Replay && c.Concurrency == 0 {
		errs = append(errs, fmt.Errorf("--rate %v: %w", c.Rate, ErrBadRate))
	}
	if c.Duration == 0 && c.Requests == 0 && !c.Replay {
		errs = append(errs, fmt.Errorf("--duration, --requests: %w", ErrUnbounded))
	}
	errs = append(errs,
		check.Range("rate", c.Rate, 0, 1e6),
		check.Duration("duration", c.Duration, 0, 24*time.Hour),
		check.Range("requests", c.Requests, 0, maxSlots),
		check.Duration("warmup", c.Warmup, 0, time.Hour),
		check.Range("max-tokens", c.MaxTokens, 0, 1<<20),
		check.Duration("timeout", c.Timeout, 0, time.Hour),
		check.Range("max-in-flight", c.MaxInFlight, 0, 1<<20),
	)
	errs = append(errs, c.validateShape()...)
	if err := check.All(errs...); err != nil {
		return err
	}
	perTarget := c.perTarget()
	if total := (c.warmSlots() + perTarget) * len(c.Targets); total > maxSlots {
		return &check.Error{Flag: "rate", Value: fmt.Sprint(c.Rate),
			Want: fmt.Sprintf("%d requests in all (warmup and measured, every target) is more than a run may send (%d)", total, maxSlots)}
	}
	return nil
}

func (c *Config) withDefaults() (Config, error) {
	cfg := *c
	if err := c.Validate(); err != nil {
		return cfg, err
	}
	if cfg.MaxTokens <= 0 {
		cfg.MaxTokens = 8
	}
	if cfg.Model == "" {
		cfg.Model = "llama-3-8b-instruct"
	}
	if cfg.Prompt == "" {
		cfg.Prompt = "What is the capital of France? Answer in one word."
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 10000
	}
	names := make([]string, len(cfg.Targets))
	for i := range names {
		switch {
		case i < len(cfg.Names) && cfg.Names[i] != "":
			names[i] = cfg.Names[i]
		case i == 0:
			names[i] = "target"
		default:
			names[i] = fmt.Sprintf("compare%d", i)
		}
	}
	cfg.Names = names
	if cfg.Stream && cfg.Workload != nil {
		w := make([]Entry, len(cfg.Workload))
		for i, e := range cfg.Workload {
			if !e.Stream {
				var m map[string]any
				if err := json.Unmarshal(e.Body, &m); err != nil {
					return cfg, fmt.Errorf("loadgen: workload request %d: %w", i+1, err)
				}
				m["stream"] = true
				e.Body, _ = json.Marshal(m)
				e.Stream = true
			}
			w[i] = e
		}
		cfg.Workload = w
	}
	if cfg.Replay {
		w := slices.Clone(cfg.Workload)
		slices.SortStableFunc(w, func(a, b Entry) int { return cmp.Compare(a.At, b.At) })
		cfg.Workload = w
	}
	targets := make([]string, len(cfg.Targets))
	for i, t := range cfg.Targets {
		u, err := url.Parse(t)
		if err != nil {
			return cfg, fmt.Errorf("loadgen: target %q: %w", t, err)
		}
		if u.Path == "" || u.Path == "/" {
			u.Path = "/v1/chat/completions"
		}
		targets[i] = u.String()
	}
	cfg.Targets = targets
	return cfg, nil
}

// perTarget is the number of measured requests per target (in a closed
// loop bounded by time only, the most it may send).
func (c *Config) perTarget() int {
	if c.Replay {
		return len(c.Workload)
	}
	if c.Concurrency > 0 && c.Requests == 0 {
		return maxSlots / max(len(c.Targets), 1)
	}
	n := c.Requests
	if c.Duration > 0 {
		if c.Concurrency > 0 {
			return n
		}
		byTime := max(int(c.Rate*c.Duration.Seconds()), 1)
		if n <= 0 || byTime < n {
			n = byTime
		}
	}
	return n
}

// warmSlots is the number of warmup requests per target of an open loop.
func (c *Config) warmSlots() int {
	if c.Replay || c.Concurrency > 0 {
		return 0
	}
	return int(c.Rate * c.Warmup.Seconds())
}

// streams reports whether any request asks for a stream.
func (c *Config) streams() bool {
	if c.Workload == nil {
		return c.Stream
	}
	for _, e := range c.Workload {
		if e.Stream {
			return true
		}
	}
	return false
}

// SlotOffset is when global slot j of a run with k targets at rate (per
// target) is due, after the start: slots are evenly spaced at k·rate per
// second and slot j goes to target j mod k.
func SlotOffset(j, k int, rate float64) time.Duration {
	return time.Duration(float64(j) * float64(time.Second) / (rate * float64(k)))
}

// Body is the request body the generator sends.
func Body(model, prompt string, maxTokens int, stream bool) []byte {
	b, _ := json.Marshal(map[string]any{
		"model":      model,
		"messages":   []map[string]string{{"role": "user", "content": prompt}},
		"max_tokens": maxTokens,
		"stream":     stream,
	})
	return b
}

// Run runs the schedule and returns the report. When ctx ends first, Run
// stops sending, cancels what is in flight, and returns the partial report
// (Interrupted set) with ctx's error.
func Run(ctx context.Context, c Config) (*Report, error) {
	cfg, err := c.withDefaults()
	if err != nil {
		return nil, err
	}
	for _, t := range cfg.Targets {
		if err := CheckLoopback(ctx, t); err != nil {
			return nil, err
		}
	}
	k := len(cfg.Targets)
	n := cfg.perTarget()
	if cfg.Concurrency > 0 && cfg.Requests == 0 {
		n = 0 // bounded by time: the report counts what was sent
	}
	g := &generator{
		cfg:    cfg,
		client: cfg.Client,
		rec:    newRecorder(k, min(n, 1<<20), cfg.streams()),
	}
	for range k {
		// One shaper per target, same seed: every target gets the same
		// sequence of requests.
		g.shapers = append(g.shapers, newShaper(&g.cfg))
	}
	if g.client == nil {
		g.client = NewClient()
	}

	reqCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A short lead lets the first slots be sent on time rather than late.
	start := time.Now().Add(5 * time.Millisecond)
	var wg sync.WaitGroup
	if cfg.Concurrency > 0 {
		g.closedLoop(ctx, reqCtx, &wg, start, n)
	} else {
		g.openLoop(ctx, reqCtx, &wg, start, n)
	}
	interrupted := ctx.Err() != nil
	if interrupted {
		cancel()
	}
	wg.Wait()
	g.stopProgress()

	if n == 0 {
		n = g.rec.sent()
	}
	rep := g.rec.report(&cfg, n)
	rep.Started = start
	rep.Interrupted = interrupted
	if interrupted {
		return rep, ctx.Err()
	}
	return rep, nil
}

// openLoop sends every slot at its scheduled time: at Rate, or at the
// workload's timestamps when replaying.
func (g *generator) openLoop(ctx, reqCtx context.Context, wg *sync.WaitGroup, start time.Time, n int) {
	cfg := &g.cfg
	k := len(cfg.Targets)
	warm := cfg.warmSlots()
	total := (warm + n) * k
	measureFrom := warm * k
	due := func(j int) time.Time { return start.Add(SlotOffset(j, k, cfg.Rate)) }
	if cfg.Replay {
		due = func(j int) time.Time { return start.Add(cfg.Workload[j/k].At) }
	}
	g.stopProgress = g.progress(due(measureFrom))
	for j := 0; j < total; j++ {
		at := due(j)
		if sleepUntil(ctx, at) != nil {
			break
		}
		target, measured := j%k, j >= measureFrom
		out := g.shapers[target].next()
		if g.inflight.Load() >= int64(cfg.MaxInFlight) {
			if measured {
				g.rec.add(target, result{sched: at, end: at, errKind: "in-flight cap"})
			}
			continue
		}
		g.inflight.Add(1)
		g.sent.Add(1)
		wg.Go(func() {
			defer g.inflight.Add(-1)
			r := g.do(reqCtx, target, at, out)
			if measured && r.errKind != errCanceled {
				g.rec.add(target, r)
			}
		})
	}
}

// closedLoop keeps Concurrency requests in flight per target until the
// measured requests are sent or the duration is over; requests sent during
// the warmup are not counted.
func (g *generator) closedLoop(ctx, reqCtx context.Context, wg *sync.WaitGroup, start time.Time, n int) {
	cfg := &g.cfg
	measureFrom := start.Add(cfg.Warmup)
	var end time.Time
	if cfg.Duration > 0 {
		end = measureFrom.Add(cfg.Duration)
	}
	g.stopProgress = g.progress(measureFrom)
	claimed := make([]atomic.Int64, len(cfg.Targets))
	for target := range cfg.Targets {
		for range cfg.Concurrency {
			wg.Go(func() {
				if sleepUntil(ctx, start) != nil {
					return
				}
				for ctx.Err() == nil {
					now := time.Now()
					if !end.IsZero() && !now.Before(end) {
						return
					}
					measured := !now.Before(measureFrom)
					if measured && n > 0 && claimed[target].Add(1) > int64(n) {
						return
					}
					out := g.shapers[target].next()
					g.inflight.Add(1)
					g.sent.Add(1)
					r := g.do(reqCtx, target, now, out)
					g.inflight.Add(-1)
					if measured && r.errKind != errCanceled {
						g.rec.add(target, r)
					}
				}
			})
		}
	}
	// The workers are waited for by Run; wait here too so that Run's
	// interrupted check sees a finished loop.
	wg.Wait()
}

// sleepUntil waits for t in short steps, so that a cancelled ctx is seen
// soon even at low rates.
func sleepUntil(ctx context.Context, t time.Time) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		d := time.Until(t)
		if d <= 0 {
			return nil
		}
		preciseSleep(min(d, 10*time.Millisecond))
	}
}

type generator struct {
	cfg          Config
	client       *http.Client
	shapers      []*shaper
	stopProgress func()
	rec          *recorder
	inflight     atomic.Int64
	sent         atomic.Int64
}

// progress prints one line a second from its own goroutine until the
// returned stop is called.
func (g *generator) progress(measureStart time.Time) (stop func()) {
	if g.cfg.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				var b strings.Builder
				phase := "measure"
				if now.Before(measureStart) {
					phase = "warmup"
				}
				fmt.Fprintf(&b, "[%5.1fs %-7s] sent %d, in flight %d", now.Sub(measureStart).Seconds(), phase, g.sent.Load(), g.inflight.Load())
				for i, w := range g.rec.window() {
					fmt.Fprintf(&b, " | %s ok %d err %d p50 %.2fms p99 %.2fms", g.cfg.Names[i], w.ok, w.errs, w.p50.Ms(), w.p99.Ms())
				}
				fmt.Fprintln(g.cfg.Progress, b.String())
			}
		}
	})
	return func() { close(done); wg.Wait() }
}
