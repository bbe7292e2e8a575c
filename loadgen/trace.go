package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard-llm/switchyard/internal/check"
)

// TraceRequest is one request of a trace replay.
type TraceRequest struct {
	// At is when it is due, from the start of the replay.
	At time.Duration
	// Body makes its body, just before it is sent, so that a long trace
	// never holds more bodies than requests in flight.
	Body func() []byte
}

// TraceConfig is how a trace is replayed.
type TraceConfig struct {
	// Target is the URL every request is posted to (a streaming endpoint:
	// each body asks for stream and stream_options.include_usage).
	Target string
	APIKey string // sent as Authorization: Bearer
	// Timeout bounds each request from its send (default 5 minutes).
	Timeout time.Duration
	// MaxInFlight bounds the requests open at once (default 1024): a
	// request due while the bound is reached waits for one to end, so a
	// slow system cannot make the replay hold an unbounded number of
	// connections. Its wait counts in its latency, as in any open loop.
	MaxInFlight int
	// Progress receives a line every ProgressEvery (default 5s; nil: none).
	Progress      io.Writer
	ProgressEvery time.Duration
	// Client sends the requests (nil: NewClient()).
	Client *http.Client
}

// TraceResult is one request of the replay as its client saw it. Times
// count from when it was due.
type TraceResult struct {
	// Failed is "" when the request was served to its end; else what
	// happened: the HTTP status (and Code, the OpenAI error code), a
	// stream that failed or ended early, a timeout, or "not sent" when the
	// replay was interrupted first.
	Failed, Code string
	Detail       string // what a failure said, shortened
	// Late is how long after it was due it was sent (waiting for
	// MaxInFlight, or a sender behind its schedule).
	Late      time.Duration
	TTFT, E2E time.Duration
	Gaps      []float64 // between successive tokens, ms
	// The usage the answer reported: Usage is false when it reported none,
	// CachedReported false when it said nothing of cached prompt tokens.
	Usage, CachedReported      bool
	Prompt, Cached, Completion int
	// Replica and Reason are X-Switchyard-Replica and -Reason, when sent.
	Replica, Reason string
}

// Trace errors.
var ErrNoRequests = errors.New("loadgen: the trace has no requests")

// NotSent is TraceResult.Failed of a request the replay never sent.
const NotSent = "not sent"

// RunTrace sends each request at its time, at most cfg.MaxInFlight open,
// and returns every request's result, in the order given. When ctx ends
// first it stops sending, cancels what is in flight and returns the
// results with ctx's error; those never sent are marked NotSent.
func RunTrace(ctx context.Context, cfg TraceConfig, reqs []TraceRequest) ([]TraceResult, error) {
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Minute
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = 1024
	}
	if cfg.ProgressEvery <= 0 {
		cfg.ProgressEvery = 5 * time.Second
	}
	if err := check.All(check.Duration("timeout", cfg.Timeout, 0, 24*time.Hour),
		check.Range("max-inflight", cfg.MaxInFlight, 1, 1<<20)); err != nil {
		return nil, err
	}
	if len(reqs) == 0 {
		return nil, ErrNoRequests
	}
	if err := CheckLoopback(ctx, cfg.Target); err != nil {
		return nil, err
	}
	g := &generator{cfg: Config{Targets: []string{cfg.Target}, Timeout: cfg.Timeout}, client: cfg.Client}
	if g.client == nil {
		g.client = NewClient()
	}
	header := http.Header{"Content-Type": contentType}
	if cfg.APIKey != "" {
		header.Set("Authorization", "Bearer "+cfg.APIKey)
	}
	out := make([]TraceResult, len(reqs))
	for i := range out {
		out[i].Failed = NotSent
	}
	var done, failed atomic.Int64
	slots := make(chan struct{}, cfg.MaxInFlight)
	reqCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now().Add(5 * time.Millisecond)
	stop := traceProgress(cfg, start, len(reqs), &g.sent, &done, &failed, slots)
	var wg sync.WaitGroup
send:
	for i, q := range reqs {
		due := start.Add(q.At)
		if sleepUntil(ctx, due) != nil {
			break
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			break send
		}
		g.sent.Add(1)
		wg.Go(func() {
			defer func() { <-slots }()
			r := g.do(reqCtx, 0, due, outgoing{body: q.Body(), header: header, stream: true, usage: true})
			out[i] = traceResult(r, due)
			if out[i].Failed != "" {
				failed.Add(1)
			}
			done.Add(1)
		})
	}
	if ctx.Err() != nil {
		cancel()
	}
	wg.Wait()
	stop()
	// Interrupted while the last requests were open cancels them too.
	return out, ctx.Err()
}

// traceResult is r as a TraceResult, its times from due.
func traceResult(r result, due time.Time) TraceResult {
	t := TraceResult{Failed: r.errKind, Code: r.code, Detail: r.errDetail, Late: r.sent.Sub(due), Replica: r.replica, Reason: r.reason}
	if r.sent.IsZero() {
		t.Late = 0
	}
	if t.Failed == "" && r.first.IsZero() {
		t.Failed = errIncomplete
	}
	if t.Failed != "" {
		return t
	}
	t.TTFT, t.E2E = r.first.Sub(due), r.end.Sub(due)
	t.Gaps = make([]float64, len(r.gaps))
	for k, g := range r.gaps {
		t.Gaps[k] = float64(g) / float64(time.Millisecond)
	}
	u := r.usage
	t.Usage, t.CachedReported = u.seen, u.cachedSeen
	t.Prompt, t.Cached, t.Completion = u.prompt, u.cached, u.completion
	if !u.seen {
		t.Completion = r.chunks
	}
	return t
}

// traceProgress prints a line every cfg.ProgressEvery from its own
// goroutine until the returned stop is called.
func traceProgress(cfg TraceConfig, start time.Time, total int, sent, done, failed *atomic.Int64, slots chan struct{}) (stop func()) {
	if cfg.Progress == nil {
		return func() {}
	}
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(cfg.ProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case now := <-t.C:
				fmt.Fprintf(cfg.Progress, "[%6.1fs] sent %d of %d, in flight %d, done %d, failed %d\n",
					now.Sub(start).Seconds(), sent.Load(), total, len(slots), done.Load(), failed.Load())
			}
		}
	})
	return func() { close(quit); wg.Wait() }
}

// FailureCounts counts the failed results by what happened ("429
// rate_limited", "timeout", "not sent"), for a report.
func FailureCounts(rs []TraceResult) map[string]int {
	out := map[string]int{}
	for _, r := range rs {
		if r.Failed == "" {
			continue
		}
		k := r.Failed
		if r.Code != "" {
			k += " " + r.Code
		}
		out[k]++
	}
	return out
}
