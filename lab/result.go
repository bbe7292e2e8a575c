package lab

import (
	"slices"
	"strings"
	"time"
)

// Result is the outcome of one run.
type Result struct {
	Requests []*Request
	Outcomes []Outcome // by request index
	// Warmup and Horizon bound the measured arrivals; Window is their span.
	Warmup, Horizon, Window time.Duration
	SLO                     time.Duration
	// Imbalance is the busiest replica's outstanding requests over the
	// mean, averaged over samples every 200 ms.
	Imbalance float64
	// Trace is every 200 ms sample (Scenario.Trace).
	Trace []Sample
	// AdaptersPerBatch is the mean number of distinct adapters in an
	// engine step (Scenario.SampleBatches).
	AdaptersPerBatch float64
	// LoraLoads and Preemptions add up the engines' counts over the run.
	LoraLoads, Preemptions int64
	// End is the virtual time the run stopped.
	End time.Duration
	// Gaps are the inter-token latencies of every request (Scenario.ITL),
	// milliseconds, and GapOf the index of the request of each.
	Gaps  []float32
	GapOf []int32
}

// ITL is the inter-token latency of the measured requests that keep
// selects (nil: all), pooled over runs: every gap between two tokens of a
// request, p50, p99 and p99.9 in milliseconds.
func ITL(rs []*Result, keep func(*Request) bool) (p50, p99, p999 float64) {
	var gaps []float64
	for _, r := range rs {
		for k, g := range r.Gaps {
			q := r.Requests[r.GapOf[k]]
			if q.At < r.Warmup || q.At >= r.Horizon || keep != nil && !keep(q) {
				continue
			}
			gaps = append(gaps, float64(g))
		}
	}
	slices.Sort(gaps)
	return percentile(gaps, 0.50), percentile(gaps, 0.99), percentile(gaps, 0.999)
}

// Sample is the cluster at a virtual time (from the start of the run):
// the load imbalance (NaN when nothing was outstanding) and the output
// tokens generated so far.
type Sample struct {
	At        time.Duration
	Imbalance float64
	Generated int64
}

// Summary is what the experiments report about a set of requests.
type Summary struct {
	N, Served, Failed int
	Offered           float64 // requests per second
	// TTFT percentiles of the served requests, milliseconds.
	P50, P90, P99, Mean float64
	// HitRate is the share of served prompt tokens the prefix caches
	// served.
	HitRate float64
	// Goodput is the requests per second that got their first token
	// within the SLO.
	Goodput float64
	// Reasons counts the routers' reasons (rejections by code).
	Reasons map[string]int
	// Failures counts failures by cause.
	Failures map[string]int
}

// Summarize reports the measured requests that keep selects (nil: all).
func (r *Result) Summarize(keep func(*Request) bool) Summary { return Pool([]*Result{r}, keep) }

// Pool summarizes several runs (seeds) of one configuration as one: their
// requests pooled, rates over the sum of their windows.
func Pool(rs []*Result, keep func(*Request) bool) Summary {
	s := Summary{Reasons: map[string]int{}, Failures: map[string]int{}}
	var ttft []float64
	var prompt, cached, good int
	var secs float64
	for _, r := range rs {
		secs += r.Window.Seconds()
		for i, q := range r.Requests {
			if q.At < r.Warmup || q.At >= r.Horizon || keep != nil && !keep(q) {
				continue
			}
			o := &r.Outcomes[i]
			s.N++
			s.Reasons[o.Reason]++
			if o.Failed != "" {
				s.Failed++
				s.Failures[o.Failed]++
				continue
			}
			s.Served++
			ttft = append(ttft, float64(o.TTFT)/float64(time.Millisecond))
			prompt += q.PromptTokens
			cached += o.Cached
			if o.TTFT <= r.SLO {
				good++
			}
		}
	}
	s.Offered = float64(s.N) / secs
	s.Goodput = float64(good) / secs
	s.HitRate = ratio(float64(cached), float64(prompt))
	slices.Sort(ttft)
	s.P50, s.P90, s.P99 = percentile(ttft, 0.50), percentile(ttft, 0.90), percentile(ttft, 0.99)
	sum := 0.0
	for _, v := range ttft {
		sum += v
	}
	s.Mean = ratio(sum, float64(len(ttft)))
	return s
}

// meanOf averages f over the runs, skipping NaN.
func meanOf(rs []*Result, f func(*Result) float64) float64 {
	sum, n := 0.0, 0
	for _, r := range rs {
		if v := f(r); v == v {
			sum += v
			n++
		}
	}
	return ratio(sum, float64(n))
}

// percentile of sorted values, nearest rank; NaN when empty.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return ratio(0, 0)
	}
	k := int(p*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(k, 0), len(sorted)-1)]
}

// FailShare is the share of requests that failed.
func (s Summary) FailShare() float64 { return ratio(float64(s.Failed), float64(s.N)) }

// StepShare is the share of requests whose deciding step (the last part
// of the reason, e.g. "stale-random" in "pool-fallback-general+stale-random")
// is step.
func (s Summary) StepShare(step string) float64 {
	n := 0
	for r, c := range s.Reasons {
		if r == step || strings.HasSuffix(r, "+"+step) {
			n += c
		}
	}
	return ratio(float64(n), float64(s.N))
}
