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
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
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
	if !(c.Rate > 0) {
		errs = append(errs, fmt.Errorf("--rate %v: %w", c.Rate, ErrBadRate))
	}
	if c.Duration == 0 && c.Requests == 0 {
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
	if err := check.All(errs...); err != nil {
		return err
	}
	perTarget := c.perTarget()
	if total := (int(c.Rate*c.Warmup.Seconds()) + perTarget) * len(c.Targets); total > maxSlots {
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

// perTarget is the number of measured requests per target.
func (c *Config) perTarget() int {
	n := c.Requests
	if c.Duration > 0 {
		byTime := max(int(c.Rate*c.Duration.Seconds()), 1)
		if n <= 0 || byTime < n {
			n = byTime
		}
	}
	return n
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
	warm := int(cfg.Rate * cfg.Warmup.Seconds())
	total := (warm + n) * k
	if total > maxSlots {
		return nil, fmt.Errorf("loadgen: %d requests is more than a run may send (%d)", total, maxSlots)
	}
	g := &generator{
		cfg:    cfg,
		client: cfg.Client,
		body:   Body(cfg.Model, cfg.Prompt, cfg.MaxTokens, cfg.Stream),
		rec:    newRecorder(k, n, cfg.Stream),
	}
	if g.client == nil {
		g.client = NewClient()
	}

	reqCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A short lead lets the first slots be sent on time rather than late.
	start := time.Now().Add(5 * time.Millisecond)
	measureFrom := warm * k
	stopProgress := g.progress(start.Add(SlotOffset(measureFrom, k, cfg.Rate)))

	var wg sync.WaitGroup
	for j := 0; j < total; j++ {
		due := start.Add(SlotOffset(j, k, cfg.Rate))
		if sleepUntil(ctx, due) != nil {
			break
		}
		target, measured := j%k, j >= measureFrom
		if g.inflight.Load() >= int64(cfg.MaxInFlight) {
			if measured {
				g.rec.add(target, result{sched: due, end: due, errKind: "in-flight cap"})
			}
			continue
		}
		g.inflight.Add(1)
		g.sent.Add(1)
		wg.Go(func() {
			defer g.inflight.Add(-1)
			r := g.do(reqCtx, target, due)
			if measured && r.errKind != errCanceled {
				g.rec.add(target, r)
			}
		})
	}
	interrupted := ctx.Err() != nil
	if interrupted {
		cancel()
	}
	wg.Wait()
	stopProgress()

	rep := g.rec.report(&cfg, n)
	rep.Started = start
	rep.Interrupted = interrupted
	if interrupted {
		return rep, ctx.Err()
	}
	return rep, nil
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
	cfg      Config
	client   *http.Client
	body     []byte
	rec      *recorder
	inflight atomic.Int64
	sent     atomic.Int64
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
