package loadgen

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// recorder collects results per target. Requests finish on their own
// goroutines; one mutex is plenty at the rates one machine can drive.
type recorder struct {
	stream bool

	mu  sync.Mutex
	per []*samples
}

type samples struct {
	latency, service, ttfb, first, gaps, lag []time.Duration
	ttft                                     []time.Duration // actual send to first data line
	ok, errs, chunks                         int
	errsBy, codesBy                          map[string]int
	refused                                  []time.Duration // HTTP errors: scheduled send to the answer's end
	refusedService                           []time.Duration // the same from the actual send
	noRetryAfter                             int             // 429s and 503s without Retry-After
	replicas, reasons                        map[string]int
	errSample                                map[string]string
	firstSched, lastSched, lastEnd           time.Time

	// The progress window: what finished since the last line.
	winLat       []time.Duration
	winOK, winEr int
}

func newRecorder(targets, perTarget int, stream bool) *recorder {
	rec := &recorder{stream: stream}
	for range targets {
		s := &samples{
			latency:   make([]time.Duration, 0, perTarget),
			service:   make([]time.Duration, 0, perTarget),
			ttfb:      make([]time.Duration, 0, perTarget),
			lag:       make([]time.Duration, 0, perTarget),
			errsBy:    map[string]int{},
			codesBy:   map[string]int{},
			errSample: map[string]string{},
			replicas:  map[string]int{},
			reasons:   map[string]int{},
		}
		if stream {
			s.first = make([]time.Duration, 0, perTarget)
		}
		rec.per = append(rec.per, s)
	}
	return rec
}

func (rec *recorder) add(target int, r result) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	s := rec.per[target]
	if s.firstSched.IsZero() || r.sched.Before(s.firstSched) {
		s.firstSched = r.sched
	}
	if r.sched.After(s.lastSched) {
		s.lastSched = r.sched
	}
	if r.end.After(s.lastEnd) {
		s.lastEnd = r.end
	}
	if !r.sent.IsZero() {
		s.lag = append(s.lag, r.sent.Sub(r.sched))
	}
	if r.errKind != "" {
		s.errs++
		s.winEr++
		s.errsBy[r.errKind]++
		if _, ok := s.errSample[r.errKind]; !ok && r.errDetail != "" {
			s.errSample[r.errKind] = r.errDetail
		}
		if r.refused {
			// An answer with an HTTP error status: a refusal.
			s.refused = append(s.refused, r.end.Sub(r.sched))
			if !r.sent.IsZero() {
				s.refusedService = append(s.refusedService, r.end.Sub(r.sent))
			}
			if r.noRetryAfter {
				s.noRetryAfter++
			}
			if r.code != "" && (len(s.codesBy) < maxLabels || s.codesBy[r.code] > 0) {
				s.codesBy[r.code]++
			}
		}
		return
	}
	s.ok++
	s.winOK++
	lat := r.end.Sub(r.sched)
	s.latency = append(s.latency, lat)
	s.winLat = append(s.winLat, lat)
	s.service = append(s.service, r.end.Sub(r.sent))
	s.ttfb = append(s.ttfb, r.head.Sub(r.sched))
	if r.replica != "" && (len(s.replicas) < maxLabels || s.replicas[r.replica] > 0) {
		s.replicas[r.replica]++
	}
	if r.reason != "" && (len(s.reasons) < maxLabels || s.reasons[r.reason] > 0) {
		s.reasons[r.reason]++
	}
	if rec.stream && !r.first.IsZero() {
		s.first = append(s.first, r.first.Sub(r.sched))
		s.ttft = append(s.ttft, r.first.Sub(r.sent))
		s.gaps = append(s.gaps, r.gaps...)
		s.chunks += r.chunks
	}
}

// maxLabels bounds the distinct replicas and reasons counted per target (a
// server could send a new one with every answer).
const maxLabels = 1000

// sent is the most requests sent to one target.
func (rec *recorder) sent() int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	n := 0
	for _, s := range rec.per {
		n = max(n, len(s.lag))
	}
	return n
}

// windowStats is one target's part of a progress line.
type windowStats struct {
	ok, errs int
	p50, p99 Dur
}

// window returns and resets what finished since the last call.
func (rec *recorder) window() []windowStats {
	rec.mu.Lock()
	out := make([]windowStats, len(rec.per))
	lats := make([][]time.Duration, len(rec.per))
	for i, s := range rec.per {
		out[i] = windowStats{ok: s.winOK, errs: s.winEr}
		lats[i] = slices.Clone(s.winLat)
		s.winLat, s.winOK, s.winEr = s.winLat[:0], 0, 0
	}
	rec.mu.Unlock()
	for i, l := range lats {
		slices.Sort(l)
		out[i].p50, out[i].p99 = Dur(Percentile(l, 50)), Dur(Percentile(l, 99))
	}
	return out
}

// report summarizes the run; it is called once every request has finished.
func (rec *recorder) report(cfg *Config, perTarget int) *Report {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rep := &Report{
		Rate: cfg.Rate, Targets: make([]TargetReport, len(rec.per)),
		Duration: Dur(cfg.Duration), Warmup: Dur(cfg.Warmup), Requests: perTarget,
		Stream: rec.stream, MaxTokens: cfg.MaxTokens, Model: cfg.Model,
		Schedule: "open loop; each target at the full rate, targets interleaved slot by slot; latency from the scheduled send time",
		Workload: cfg.describe(), Concurrency: cfg.Concurrency,
	}
	switch {
	case cfg.Concurrency > 0:
		rep.Rate = 0
		rep.Schedule = fmt.Sprintf("closed loop; %d requests in flight per target, each sent when the one before it finished; latency from the send", cfg.Concurrency)
	case cfg.Replay:
		rep.Rate = 0
		rep.Schedule = "open loop at the workload's timestamps; latency from the scheduled send time"
	}
	for i, s := range rec.per {
		t := TargetReport{
			Name: cfg.Names[i], URL: cfg.Targets[i],
			Scheduled: perTarget, Sent: len(s.lag), OK: s.ok, Errors: s.errs,
			Latency: Summarize(s.latency), Service: Summarize(s.service),
			TTFB: Summarize(s.ttfb), SendLag: Summarize(s.lag),
		}
		if s.errs > 0 {
			t.ErrorsBy = s.errsBy
		}
		if len(s.refused) > 0 {
			ref := Summarize(s.refused)
			t.Refused = &ref
		}
		if len(s.refusedService) > 0 {
			ref := Summarize(s.refusedService)
			t.RefusedService = &ref
		}
		if len(s.codesBy) > 0 {
			t.CodesBy = s.codesBy
		}
		t.NoRetryAfter = s.noRetryAfter
		if len(s.errSample) > 0 {
			t.ErrorSamples = s.errSample
		}
		if span := s.lastSched.Sub(s.firstSched).Seconds(); span > 0 && t.Sent > 1 {
			t.SentRate = float64(t.Sent-1) / span
		}
		if span := s.lastEnd.Sub(s.firstSched).Seconds(); span > 0 {
			t.OKRate = float64(s.ok) / span
		}
		if rec.stream {
			first, gaps, ttft := Summarize(s.first), Summarize(s.gaps), Summarize(s.ttft)
			t.FirstData, t.Gaps, t.TTFT = &first, &gaps, &ttft
			if span := s.lastEnd.Sub(s.firstSched).Seconds(); span > 0 {
				t.ChunkRate = float64(s.chunks) / span
			}
		}
		if len(s.replicas) > 0 {
			t.Replicas = s.replicas
		}
		if len(s.reasons) > 0 {
			t.Reasons = s.reasons
		}
		rep.Targets[i] = t
	}
	for i := 1; i < len(rep.Targets); i++ {
		rep.Diffs = append(rep.Diffs, Compare(&rep.Targets[0], &rep.Targets[i]))
	}
	return rep
}
