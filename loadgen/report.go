package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is the outcome of a run.
type Report struct {
	Started     time.Time `json:"started"`
	Schedule    string    `json:"schedule"`
	Rate        float64   `json:"rate_per_target"`
	Duration    Dur       `json:"duration_ms"`
	Warmup      Dur       `json:"warmup_ms"`
	Requests    int       `json:"requests_per_target"`
	Stream      bool      `json:"stream"`
	MaxTokens   int       `json:"max_tokens"`
	Model       string    `json:"model"`
	Interrupted bool      `json:"interrupted,omitempty"`
	// Workload describes how the requests were shaped ("" = one fixed
	// short prompt); Concurrency is set for a closed loop.
	Workload    string `json:"workload,omitempty"`
	Concurrency int    `json:"concurrency,omitempty"`

	Targets []TargetReport `json:"targets"`
	// Diffs compare every target after the first with the first.
	Diffs []Diff `json:"diffs,omitempty"`
}

// TargetReport is what one target did. Latencies count successful requests
// only; errors are counted by kind (an HTTP status, "timeout", "transport",
// "incomplete stream", "stream error event", "in-flight cap").
type TargetReport struct {
	Name      string         `json:"name"`
	URL       string         `json:"url"`
	Scheduled int            `json:"scheduled"`
	Sent      int            `json:"sent"`
	OK        int            `json:"ok"`
	Errors    int            `json:"errors"`
	ErrorsBy  map[string]int `json:"errors_by,omitempty"`
	// CodesBy counts the answers with an HTTP error status by their
	// OpenAI error code; Refused is their latency, from the scheduled
	// send to the answer's end: how fast a refusal is. RefusedService is
	// the same from the actual send, the generator's own lateness left
	// out, as Service is for successes.
	CodesBy        map[string]int `json:"codes_by,omitempty"`
	Refused        *Summary       `json:"refused,omitempty"`
	RefusedService *Summary       `json:"refused_service,omitempty"`
	// NoRetryAfter counts the 429 and 503 answers that did not say when
	// to come back (no Retry-After header).
	NoRetryAfter int `json:"refused_without_retry_after,omitempty"`
	// ErrorSamples holds, per kind, what the first such failure said (the
	// response body of an HTTP error, shortened).
	ErrorSamples map[string]string `json:"error_samples,omitempty"`
	// SentRate is requests sent per second of schedule; OKRate successes
	// per second from the first scheduled send to the last answer.
	SentRate float64 `json:"sent_rate"`
	OKRate   float64 `json:"ok_rate"`

	// Latency runs from the scheduled send to the end of the body; Service
	// from the actual send (the generator's own lateness excluded); TTFB
	// from the scheduled send to the response headers.
	Latency Summary `json:"latency"`
	Service Summary `json:"service"`
	TTFB    Summary `json:"ttfb"`
	// FirstData (scheduled send to the first SSE data line) and Gaps
	// (between successive data lines, [DONE] included) are set for streams.
	FirstData *Summary `json:"first_data,omitempty"`
	Gaps      *Summary `json:"gaps,omitempty"`
	// SendLag is how late the generator sent after the scheduled time.
	SendLag Summary `json:"send_lag"`

	// TTFT (actual send to the first data line) and ChunkRate (data lines
	// per second, the streams' throughput) are set for streams; Gaps is
	// the inter-token latency as a client sees it.
	TTFT      *Summary `json:"ttft,omitempty"`
	ChunkRate float64  `json:"chunks_per_s,omitempty"`
	// Replicas and Reasons count successful requests by the replica that
	// served them and the routing decision's reason, from the
	// X-Switchyard-Replica and X-Switchyard-Reason response headers.
	Replicas map[string]int `json:"replicas,omitempty"`
	Reasons  map[string]int `json:"reasons,omitempty"`
}

// ErrorRate is the share of scheduled requests that failed.
func (t *TargetReport) ErrorRate() float64 {
	if t.Scheduled == 0 {
		return 0
	}
	return float64(t.Errors) / float64(t.Scheduled)
}

// Delta is a target's percentiles minus the reference's.
type Delta struct {
	P50 Dur `json:"p50_ms"`
	P90 Dur `json:"p90_ms"`
	P99 Dur `json:"p99_ms"`
	Max Dur `json:"max_ms"`
}

func delta(ref, t *Summary) Delta {
	return Delta{P50: t.P50 - ref.P50, P90: t.P90 - ref.P90, P99: t.P99 - ref.P99, Max: t.Max - ref.Max}
}

// Diff compares a target with the reference target.
type Diff struct {
	Target    string `json:"target"`
	Reference string `json:"reference"`
	Latency   Delta  `json:"latency"`
	TTFB      Delta  `json:"ttfb"`
	FirstData *Delta `json:"first_data,omitempty"`
	Gaps      *Delta `json:"gaps,omitempty"`
	// RatioP50 and RatioP99 are the target's latency over the reference's.
	RatioP50 float64 `json:"ratio_p50"`
	RatioP99 float64 `json:"ratio_p99"`
}

// Compare is t measured against ref.
func Compare(ref, t *TargetReport) Diff {
	d := Diff{Target: t.Name, Reference: ref.Name, Latency: delta(&ref.Latency, &t.Latency), TTFB: delta(&ref.TTFB, &t.TTFB)}
	if ref.FirstData != nil && t.FirstData != nil {
		fd := delta(ref.FirstData, t.FirstData)
		d.FirstData = &fd
	}
	if ref.Gaps != nil && t.Gaps != nil {
		g := delta(ref.Gaps, t.Gaps)
		d.Gaps = &g
	}
	if ref.Latency.P50 > 0 {
		d.RatioP50 = float64(t.Latency.P50) / float64(ref.Latency.P50)
	}
	if ref.Latency.P99 > 0 {
		d.RatioP99 = float64(t.Latency.P99) / float64(ref.Latency.P99)
	}
	return d
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// ReadJSON reads a report written by WriteJSON.
func ReadJSON(rd io.Reader) (*Report, error) {
	var r Report
	if err := json.NewDecoder(rd).Decode(&r); err != nil {
		return nil, fmt.Errorf("loadgen: read report: %w", err)
	}
	return &r, nil
}

// WriteText writes the report as tables, milliseconds throughout.
func (r *Report) WriteText(w io.Writer) error {
	mode := "non-stream"
	if r.Stream {
		mode = "stream"
	}
	if r.Concurrency > 0 {
		fmt.Fprintf(w, "%s, %s: %d target(s), %d requests each, max_tokens %d, model %s\n",
			r.Schedule, mode, len(r.Targets), r.Requests, r.MaxTokens, r.Model)
	} else {
		fmt.Fprintf(w, "%s, %s: %g req/s per target × %d target(s), %d requests each, max_tokens %d, model %s\n",
			r.Schedule, mode, r.Rate, len(r.Targets), r.Requests, r.MaxTokens, r.Model)
	}
	if r.Workload != "" {
		fmt.Fprintf(w, "workload: %s\n", r.Workload)
	}
	if r.Interrupted {
		fmt.Fprintln(w, "INTERRUPTED: partial results")
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "target\tok\terr\tsent/s\tok/s\tp50\tp90\tp99\tmax\tttfb p50\tttfb p99\t"
	if r.Stream {
		head += "first p50\tttft p50\tttft p99\titl p50\titl p99\titl max\tchunks/s\t"
	}
	fmt.Fprintln(tw, head+"svc p50\tsvc p99\tlag p99\t")
	for i := range r.Targets {
		t := &r.Targets[i]
		l := &t.Latency
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%.1f\t%s\t%s\t%s\t%s\t%s\t%s\t", t.Name, t.OK, t.Errors, t.SentRate, t.OKRate,
			ms(l.P50), ms(l.P90), ms(l.P99), ms(l.Max), ms(t.TTFB.P50), ms(t.TTFB.P99))
		if r.Stream && t.Gaps != nil {
			ttft := t.TTFT
			if ttft == nil {
				ttft = &Summary{}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%.0f\t", ms(t.FirstData.P50), ms(ttft.P50), ms(ttft.P99),
				ms(t.Gaps.P50), ms(t.Gaps.P99), ms(t.Gaps.Max), t.ChunkRate)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t\n", ms(t.Service.P50), ms(t.Service.P99), ms(t.SendLag.P99))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for i := range r.Targets {
		t := &r.Targets[i]
		if t.Errors == 0 {
			continue
		}
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(t.ErrorsBy)) {
			parts = append(parts, fmt.Sprintf("%s ×%d", k, t.ErrorsBy[k]))
		}
		fmt.Fprintf(w, "errors of %s: %s\n", t.Name, strings.Join(parts, ", "))
		for _, k := range slices.Sorted(maps.Keys(t.ErrorSamples)) {
			fmt.Fprintf(w, "  first %s: %s\n", k, t.ErrorSamples[k])
		}
	}
	for i := range r.Targets {
		t := &r.Targets[i]
		WriteShare(w, t.Name, "replica", t.Replicas)
		WriteShare(w, t.Name, "decision reason", t.Reasons)
	}
	if len(r.Diffs) == 0 {
		return nil
	}
	fmt.Fprintf(w, "difference from %s (ms):\n", r.Diffs[0].Reference)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head = "target\tp50\tp90\tp99\tmax\t×p50\t×p99\tttfb p50\tttfb p99\t"
	if r.Stream {
		head += "first p50\tgap p50\tgap p99\t"
	}
	fmt.Fprintln(tw, head)
	for _, d := range r.Diffs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.2f\t%.2f\t%s\t%s\t", d.Target, signed(d.Latency.P50), signed(d.Latency.P90),
			signed(d.Latency.P99), signed(d.Latency.Max), d.RatioP50, d.RatioP99, signed(d.TTFB.P50), signed(d.TTFB.P99))
		if r.Stream && d.Gaps != nil {
			fmt.Fprintf(tw, "%s\t%s\t%s\t", signed(d.FirstData.P50), signed(d.Gaps.P50), signed(d.Gaps.P99))
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// WriteShare writes one line, "<target> by <what>: …": the share of
// requests per label, largest first.
func WriteShare(w io.Writer, target, what string, counts map[string]int) {
	if len(counts) == 0 {
		return
	}
	total := 0
	for _, n := range counts {
		total += n
	}
	keys := slices.SortedFunc(maps.Keys(counts), func(a, b string) int {
		if c := counts[b] - counts[a]; c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %.1f%% (%d)", k, 100*float64(counts[k])/float64(total), counts[k])
	}
	fmt.Fprintf(w, "%s by %s: %s\n", target, what, strings.Join(parts, ", "))
}

func ms(d Dur) string     { return fmt.Sprintf("%.3f", d.Ms()) }
func signed(d Dur) string { return fmt.Sprintf("%+.3f", d.Ms()) }
