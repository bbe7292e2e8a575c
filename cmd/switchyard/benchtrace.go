package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/switchyard-llm/switchyard/internal/check"
	"github.com/switchyard-llm/switchyard/lab"
	"github.com/switchyard-llm/switchyard/loadgen"
)

// ArmSystem is bench-replay.csv's arm: the running system.
const ArmSystem = "system"

// traceFlags are bench --trace's own flags.
type traceFlags struct {
	trace, format, out           *string
	speedup                      *float64
	limit, blockTokens, inFlight *int
}

func addTraceFlags(fs *flag.FlagSet) traceFlags {
	return traceFlags{
		trace:       fs.String("trace", "", "replay this trace (the formats of switchyard lab replay) against --target in real time, instead of a generated load"),
		format:      fs.String("format", lab.FormatMooncake, "--trace: the trace's format, "+strings.Join(lab.TraceFormats(), " or ")),
		out:         fs.String("out", ".", "--trace: directory for bench-replay.csv"),
		speedup:     fs.Float64("speedup", 1, "--trace: time compression (the trace's timestamps divided by it)"),
		limit:       fs.Int("limit", 0, "--trace: the trace's first N requests (0: all)"),
		blockTokens: fs.Int("block-tokens", 512, "--trace: tokens of one of the trace's hash ids (each becomes a fixed block of that many words of text)"),
		inFlight:    fs.Int("max-inflight", 1024, "--trace: most requests open at once; one due beyond it waits, and its wait counts in its latency"),
	}
}

// validate range-checks the trace flags' values, given or not.
func (tf traceFlags) validate() error {
	return checked(check.Range("limit", *tf.limit, 0, 1<<30), check.Range("block-tokens", *tf.blockTokens, 1, 1<<20),
		check.Range("max-inflight", *tf.inFlight, 1, 1<<20), check.Range("speedup", *tf.speedup, 1e-6, 1e6))
}

// traceOnly are the flags only --trace takes; benchOnly those it refuses.
var (
	traceOnly = []string{"format", "out", "speedup", "limit", "block-tokens", "max-inflight"}
	benchOnly = []string{"compare", "names", "rate", "duration", "requests", "warmup", "stream", "max-tokens", "prompt-bytes",
		"shared-prefix", "conversations", "workload", "concurrency", "seed", "json", "stages", "stages-url"}
)

// checkTraceFlags refuses a flag that does not go with --trace being given
// or not.
func checkTraceFlags(fs *flag.FlagSet, tracing bool) error {
	var bad []string
	fs.Visit(func(f *flag.Flag) {
		if tracing && slices.Contains(benchOnly, f.Name) || !tracing && slices.Contains(traceOnly, f.Name) {
			bad = append(bad, "--"+f.Name)
		}
	})
	switch {
	case len(bad) == 0:
		return nil
	case tracing:
		return usagef("%s do not apply to --trace (its requests, their times and their sizes come from the trace)", strings.Join(bad, ", "))
	default:
		return usagef("%s are for --trace", strings.Join(bad, ", "))
	}
}

// runBenchTrace replays a trace against a running gateway in real time
// (switchyard bench --trace): every request a completion of the trace's
// prompt (its hash ids as text, lab.TraceText) with max_tokens its output
// length and ignore_eos, streamed with usage. It prints a row of the
// columns of lab replay, writes it to bench-replay.csv (arm "system") and
// exits 0 whatever the answers were.
func runBenchTrace(ctx context.Context, tf traceFlags, target, model, apiKey string, timeout time.Duration, quiet bool, stdout, stderr io.Writer) error {
	if err := checked(check.Duration("timeout", timeout, time.Millisecond, 24*time.Hour)); err != nil {
		return err
	}
	if !slices.Contains(lab.TraceFormats(), *tf.format) {
		return usagef("--format %q: want one of %s", *tf.format, strings.Join(lab.TraceFormats(), ", "))
	}
	if target == "" {
		return usagef("--trace needs --target, the gateway's URL")
	}
	target, err := traceTarget(target)
	if err != nil {
		return usageError{err}
	}
	recs, bound, err := readTrace(*tf.trace, *tf.format, *tf.blockTokens, *tf.limit)
	if err != nil {
		return err
	}
	reqs := make([]loadgen.TraceRequest, len(recs))
	bt := *tf.blockTokens
	for i := range recs {
		rec := &recs[i]
		reqs[i] = loadgen.TraceRequest{
			At:   time.Duration(float64(rec.At) / *tf.speedup),
			Body: func() []byte { return traceBody(model, rec, bt, uint64(rec.Line)) },
		}
	}
	cfg := loadgen.TraceConfig{Target: target, APIKey: apiKey, Timeout: timeout, MaxInFlight: *tf.inFlight}
	if !quiet {
		cfg.Progress = stderr
	}
	fmt.Fprintf(stderr, "bench: replaying %d requests of %s at speedup %g (%s) against %s\n", len(recs), *tf.trace, *tf.speedup,
		(reqs[len(reqs)-1].At).Round(time.Second), target)
	start := time.Now()
	results, runErr := loadgen.RunTrace(ctx, cfg, reqs)
	if results == nil {
		if errors.Is(runErr, loadgen.ErrNotLoopback) {
			return usageError{runErr}
		}
		return runErr
	}
	row, unreported := traceRow(recs, reqs, results)
	row.Arm, row.Speedup = ArmSystem, *tf.speedup
	writeTraceSummary(stdout, row, results, unreported, bound, time.Since(start))
	if err := writeReplayCSV(filepath.Join(*tf.out, "bench-replay.csv"), row); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "bench: %s written\n", filepath.Join(*tf.out, "bench-replay.csv"))
	if runErr != nil {
		return fmt.Errorf("interrupted: %w", runErr)
	}
	return nil
}

// traceTarget is the URL the replay posts to: target, with the
// completions path when it has none.
func traceTarget(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return "", fmt.Errorf("--target %q: want scheme://host[:port][/path]", raw)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/completions"
	}
	return u.String(), nil
}

// readTrace reads the whole trace before anything is sent, so a bad line
// is refused as lab replay refuses it, and returns its requests and its
// infinite-cache hit rate.
func readTrace(path, format string, blockTokens, limit int) ([]lab.TraceRecord, float64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, 0, err
	}
	tr, err := lab.LoadTrace(lab.ReplayConfig{Name: path, R: bytes.NewReader(data), Format: format, BlockTokens: blockTokens, Limit: limit},
		lab.Options{Scale: lab.Full})
	if err != nil {
		return nil, 0, err
	}
	rd, err := lab.NewTraceReader(path, bytes.NewReader(data), format, blockTokens)
	if err != nil {
		return nil, 0, err
	}
	recs := make([]lab.TraceRecord, 0, len(tr.Requests))
	for len(recs) < len(tr.Requests) {
		var rec lab.TraceRecord
		ok, err := rd.Next(&rec)
		if err != nil {
			return nil, 0, err
		}
		if !ok {
			break
		}
		rec.Hashes = slices.Clone(rec.Hashes)
		recs = append(recs, rec)
	}
	return recs, tr.Bound, nil
}

// traceBody is one request of the replay: a streamed completion of the
// record's prompt, as long as its output length.
func traceBody(model string, rec *lab.TraceRecord, blockTokens int, unique uint64) []byte {
	body := struct {
		Model         string          `json:"model"`
		Prompt        string          `json:"prompt"`
		MaxTokens     int             `json:"max_tokens"`
		IgnoreEOS     bool            `json:"ignore_eos"`
		Stream        bool            `json:"stream"`
		StreamOptions map[string]bool `json:"stream_options"`
	}{model, string(lab.TraceText(make([]byte, 0, 4*rec.Input), rec, blockTokens, unique)), max(rec.Output, 1), true, true,
		map[string]bool{"include_usage": true}}
	b, err := json.Marshal(body)
	if err != nil {
		panic(err) // strings and numbers only
	}
	return b
}

// traceRow measures the replay as lab replay measures an arm. An answer
// that reported no cached tokens counts as none cached: vLLM leaves
// prompt_tokens_details out when nothing was (and always without
// --enable-prompt-tokens-details); unreported counts them, and the hit rate
// is unknown (NaN) when no answer reported any.
func traceRow(recs []lab.TraceRecord, reqs []loadgen.TraceRequest, rs []loadgen.TraceResult) (row lab.ReplayRow, unreported int) {
	samples := make([]lab.RowSample, len(rs))
	var gaps []float64
	for i, r := range rs {
		s := lab.RowSample{At: reqs[i].At, Failed: r.Failed != "", Reason: r.Failed}
		if !s.Failed {
			s.Reason = r.Reason
			s.TTFT, s.E2E, s.Output = r.TTFT, r.E2E, r.Completion
			s.Prompt, s.Cached = recs[i].Input, 0
			if r.Usage && r.Prompt > 0 {
				s.Prompt = r.Prompt
			}
			if r.CachedReported {
				s.Cached = r.Cached
			} else {
				unreported++
			}
			gaps = append(gaps, r.Gaps...)
		}
		samples[i] = s
	}
	row = lab.MeasureRow(samples, gaps)
	if served := row.Requests - row.Refused; served > 0 && unreported == served {
		row.HitRate = math.NaN()
	}
	return row, unreported
}

func writeTraceSummary(w io.Writer, row lab.ReplayRow, rs []loadgen.TraceResult, unreported int, bound float64, took time.Duration) {
	late, worst := 0, time.Duration(0)
	for _, r := range rs {
		if r.Late > 100*time.Millisecond {
			late++
		}
		worst = max(worst, r.Late)
	}
	fmt.Fprintf(w, "switchyard bench --trace, %s, %s\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), took.Round(time.Second))
	fmt.Fprintf(w, "  requests %d, served %d, failed %d\n", row.Requests, row.Requests-row.Refused, row.Refused)
	if math.IsNaN(row.HitRate) {
		fmt.Fprintf(w, "  hit rate unknown: no answer reported cached tokens (vLLM: --enable-prompt-tokens-details); the trace's infinite-cache bound %.1f%%\n", 100*bound)
	} else {
		fmt.Fprintf(w, "  hit rate %.1f%% of prompt tokens (the trace's infinite-cache bound %.1f%%)", 100*row.HitRate, 100*bound)
		if unreported > 0 {
			fmt.Fprintf(w, "; %d served answers reported no cached tokens and count as none cached", unreported)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "  TTFT p50 %.1f ms, p90 %.1f ms, p99 %.1f ms (a failed request at the longest)\n", row.P50, row.P90, row.P99)
	fmt.Fprintf(w, "  e2e p50 %.1f ms, p99 %.1f ms; ITL p99 %.1f ms; %.1f output tokens/s\n", row.E2E50, row.E2E99, row.ITL99, row.OutputTPS)
	fmt.Fprintf(w, "  sent late (over 100 ms after due): %d, the latest by %s\n", late, worst.Round(time.Millisecond))
	byReplica, byReason := map[string]int{}, map[string]int{}
	for _, r := range rs {
		if r.Failed == "" && r.Replica != "" {
			byReplica[r.Replica]++
			byReason[r.Reason]++
		}
	}
	loadgen.WriteShare(w, "  served", "replica", byReplica)
	loadgen.WriteShare(w, "  served", "decision reason", byReason)
	fails := loadgen.FailureCounts(rs)
	for _, k := range slices.Sorted(maps.Keys(fails)) {
		fmt.Fprintf(w, "  failed: %d × %s\n", fails[k], k)
	}
}

// writeReplayCSV writes row as replay.csv's columns (lab.ReplayHeader).
func writeReplayCSV(path string, row lab.ReplayRow) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	cw := csv.NewWriter(f)
	_ = cw.Write(lab.ReplayHeader)
	_ = cw.Write(row.CSVRow())
	cw.Flush()
	if err := cw.Error(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
