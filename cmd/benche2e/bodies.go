package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/switchyard-llm/switchyard/internal/sse"
	"github.com/switchyard-llm/switchyard/internal/stages"
	"github.com/switchyard-llm/switchyard/loadgen"
)

// The body phases measure what a long prompt costs each path: one request
// at a time over body sizes, then many at once with a long prompt.

// bodySize is the one-at-a-time result for one body size.
type bodySize struct {
	KB     int                    `json:"kb"`
	Bytes  int                    `json:"bytes"`
	Rounds int                    `json:"rounds"`
	Paths  map[string]pathSummary `json:"paths"`
	// Floor is the nats-floor role's round with the legs of this size,
	// one before each measured round of the paths (zero when it did not
	// run).
	Floor pathSummary `json:"floor"`
	Load  float64     `json:"loadavg_start"`
	// Stages is the stage table of Switchyard's requests of this size.
	Stages *stages.Summary `json:"stages,omitempty"`
}

// concPhase is the closed-loop result at a fixed concurrency.
type concPhase struct {
	Concurrency int                    `json:"concurrency"`
	KB          int                    `json:"kb"`
	Bytes       int                    `json:"bytes"`
	Duration    loadgen.Dur            `json:"duration_ms"`
	Paths       map[string]pathSummary `json:"paths"`
	Load        float64                `json:"loadavg_start"`
}

// pathSummary is one path's latencies in a body phase: total for a
// non-streamed request, time to the first data line for a stream.
type pathSummary struct {
	OK     int         `json:"ok"`
	Errors int         `json:"errors"`
	Err    string      `json:"first_error,omitempty"`
	P50    loadgen.Dur `json:"p50_ms"`
	P90    loadgen.Dur `json:"p90_ms"`
	P99    loadgen.Dur `json:"p99_ms"`
}

// promptBody is a chat request of about size bytes: a pasted document of
// prose paragraphs and a question, as long-context traffic looks.
func promptBody(model string, size, maxTokens int, stream bool) []byte {
	sentences := []string{
		"The router reads the headers and never the body. ",
		"Each replica reports its queue depth and KV-cache use every second. ",
		"Prefix affinity sends a conversation back to the replica that holds its cache, ",
		"unless that replica is saturated, in which case the power of two choices decides. ",
		"Quotas are reserved at admission and settled from the usage the adapter reports. ",
		"A canary receives a sticky share of the conversations named by the table.",
	}
	var sb strings.Builder
	overhead := len(loadgen.Body(model, "", maxTokens, stream))
	for i := 0; sb.Len() < size-overhead-40; i++ {
		sb.WriteString(sentences[i%len(sentences)])
		if i%7 == 6 {
			sb.WriteString("\n\n") // two bytes more once escaped
		}
	}
	sb.WriteString("\n\nWhat does the router read?")
	return loadgen.Body(model, sb.String(), maxTokens, stream)
}

// sample is one request's outcome in a body phase.
type sample struct {
	path int
	d    time.Duration
	err  string
}

// once sends body to url and returns the latency: to the end of a
// non-streamed answer, to the first data line of a stream.
func (b *bench) once(ctx context.Context, url string, body []byte, stream bool) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := b.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, fmt.Errorf("%d %s", resp.StatusCode, bytes.TrimSpace(msg))
	}
	if !stream {
		n, err := io.Copy(io.Discard, resp.Body)
		if err == nil && n == 0 {
			err = errors.New("empty body")
		}
		return time.Since(start), err
	}
	r := sse.NewReader(resp.Body, 64<<10)
	var first time.Duration
	for {
		l, err := r.Next()
		if err != nil {
			return 0, fmt.Errorf("stream ended without [DONE]: %w", err)
		}
		if l.Field == "event" && string(l.Value) == "error" {
			return 0, errors.New("stream error event")
		}
		if l.Field == "data" && first == 0 {
			first = time.Since(start)
		}
		if l.Done() {
			return first, nil
		}
	}
}

// bodySizes sends one request at a time, the three paths in turn (the
// order rotating each round so none always follows another), rounds times
// per size after a few unmeasured rounds.
func (b *bench) bodySizes(ctx context.Context) ([]bodySize, error) {
	var out []bodySize
	for _, kb := range b.cfg.bodyKB {
		body := promptBody(b.cfg.model, kb<<10, b.cfg.maxTokens, false)
		fmt.Fprintf(os.Stderr, "== body %d KB (%d bytes), one request at a time, %d rounds\n", kb, len(body), b.cfg.bodyRounds)
		var samples []sample
		load := b.settle(ctx)
		const warm = 3
		floor := len(pathNames) // the floor's sample index
		withFloor := b.floorURL != ""
		for r := -warm; r < b.cfg.bodyRounds; r++ {
			if r == 0 {
				b.resetStages(ctx, b.ctlURL)
			}
			if r == 0 && withFloor {
				// The last warm round's Switchyard request is the shape;
				// without it the size has no floor (and its verdict
				// says so), the other paths are measured all the same.
				if err := b.floorLegs(ctx); err != nil {
					fmt.Fprintln(os.Stderr, "   no floor at this size:", err)
					withFloor = false
				}
			}
			if r >= 0 && withFloor {
				d, err := b.floorOnce(ctx)
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				samples = append(samples, sample{path: floor, d: d, err: errString(err)})
			}
			for k := range pathNames {
				i := (k + max(r, 0)) % len(pathNames)
				d, err := b.once(ctx, b.urls[i], body, false)
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				if r >= 0 {
					samples = append(samples, sample{path: i, d: d, err: errString(err)})
				}
			}
		}
		bs := bodySize{KB: kb, Bytes: len(body), Rounds: b.cfg.bodyRounds, Paths: summarize(samples), Floor: summarizeOne(samples, floor), Load: load,
			Stages: b.stageTable(ctx, b.ctlURL)}
		for _, p := range pathNames {
			s := bs.Paths[p]
			fmt.Fprintf(os.Stderr, "   %-10s p50 %7.3fms p90 %7.3fms errors %d %s\n", p, s.P50.Ms(), s.P90.Ms(), s.Errors, s.Err)
		}
		if s := bs.Floor; withFloor {
			fmt.Fprintf(os.Stderr, "   %-10s p50 %7.3fms p90 %7.3fms errors %d %s\n", "nats-floor", s.P50.Ms(), s.P90.Ms(), s.Errors, s.Err)
		}
		out = append(out, bs)
	}
	return out, nil
}

// concurrent keeps n streamed requests in flight for d (after a warmup),
// each worker taking the three paths in turn, and measures the time to the
// first data line.
func (b *bench) concurrent(ctx context.Context) (*concPhase, error) {
	n, kb := b.cfg.concurrency, b.cfg.concKB
	body := promptBody(b.cfg.model, kb<<10, b.cfg.maxTokens, true)
	fmt.Fprintf(os.Stderr, "== concurrency %d, %d KB bodies, stream, %s\n", n, kb, b.cfg.concDuration)
	load := b.settle(ctx)
	start := time.Now()
	measureFrom := start.Add(b.cfg.concWarmup)
	stop := measureFrom.Add(b.cfg.concDuration)
	var mu sync.Mutex
	var samples []sample
	var wg sync.WaitGroup
	for w := range n {
		wg.Go(func() {
			for j := w; time.Now().Before(stop) && ctx.Err() == nil; j++ {
				i := j % len(pathNames)
				sent := time.Now()
				d, err := b.once(ctx, b.urls[i], body, true)
				if sent.Before(measureFrom) || ctx.Err() != nil {
					continue
				}
				mu.Lock()
				samples = append(samples, sample{path: i, d: d, err: errString(err)})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	b.client.CloseIdleConnections()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cp := &concPhase{Concurrency: n, KB: kb, Bytes: len(body), Duration: loadgen.Dur(b.cfg.concDuration), Paths: summarize(samples), Load: load}
	for _, p := range pathNames {
		s := cp.Paths[p]
		fmt.Fprintf(os.Stderr, "   %-10s n %5d TTFT p50 %7.3fms p90 %7.3fms p99 %7.3fms errors %d %s\n", p, s.OK, s.P50.Ms(), s.P90.Ms(), s.P99.Ms(), s.Errors, s.Err)
	}
	return cp, nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func summarize(samples []sample) map[string]pathSummary {
	out := map[string]pathSummary{}
	for i, p := range pathNames {
		out[p] = summarizeOne(samples, i)
	}
	return out
}

// summarizeOne is the summary of the samples of path i.
func summarizeOne(samples []sample, i int) pathSummary {
	var ds []time.Duration
	var s pathSummary
	for _, x := range samples {
		switch {
		case x.path != i:
		case x.err != "":
			s.Errors++
			if s.Err == "" {
				s.Err = x.err
			}
		default:
			ds = append(ds, x.d)
		}
	}
	slices.Sort(ds)
	s.OK = len(ds)
	s.P50 = loadgen.Dur(loadgen.Percentile(ds, 50))
	s.P90 = loadgen.Dur(loadgen.Percentile(ds, 90))
	s.P99 = loadgen.Dur(loadgen.Percentile(ds, 99))
	return s
}

// parseKB reads a comma-separated list of sizes in KB.
func parseKB(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("bad size %q (KB)", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// added is a path's p50 over direct's.
func added(m map[string]pathSummary, path string) loadgen.Dur {
	return m[path].P50 - m["direct"].P50
}

// bodyTarget is the most Switchyard may add at one size: what the reverse
// proxy adds (0 when it adds less than nothing), plus the bus floor's round
// at the same size, plus 0.2 ms: a proxy with a bus, and no more.
func bodyTarget(proxyAdds, floor loadgen.Dur) loadgen.Dur {
	return max(proxyAdds, 0) + floor + loadgen.Dur(200*time.Microsecond)
}

// bodyVerdict judges one size: ok, and the line's text.
func bodyVerdict(bs *bodySize) (ok bool, line string) {
	px, sy := added(bs.Paths, "proxy"), added(bs.Paths, "switchyard")
	if bs.Floor.OK == 0 {
		return false, fmt.Sprintf("one at a time, %d KB: Switchyard adds %s ms; no floor measured", bs.KB, signed(sy))
	}
	t := bodyTarget(px, bs.Floor.P50)
	return sy <= t, fmt.Sprintf("one at a time, %d KB: Switchyard adds %s ms, at most the proxy's %s + the floor's %s + 0.200 = %s ms",
		bs.KB, signed(sy), signed(px), f3(bs.Floor.P50), f3(t))
}

// concTarget is the most Switchyard may add to p50 TTFT in the concurrency
// phase.
const concTarget = loadgen.Dur(5 * time.Millisecond)

func renderBodies(p func(string, ...any), r *results) {
	if len(r.Bodies) > 0 {
		p("### Long prompts, one request at a time\n\n")
		p("Non-streamed chat requests whose one user message is a pasted document, each size sent %d times down each path after 3 unmeasured rounds, "+
			"one request at a time, the three paths taking turns (the order rotating each round), each round led by one round of the bus floor (`nats-floor`: "+
			"a nats.go client and responder through Switchyard's NATS server over TCP, under a gateway's and an adapter's identities, sending the request "+
			"and reply messages of the last Switchyard request of that size, header lines and bodies of the same sizes, timed by the floor). "+
			"Median latency in milliseconds; the target for Switchyard is at most what the proxy adds (0 if less), plus the floor's round, plus 0.2 ms.\n\n", r.Bodies[0].Rounds)
		p("| body | load at start | direct p50 | proxy p50 | switchyard p50 | nats-floor p50 | proxy adds | Switchyard adds | target | met | errors |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|\n")
		for i := range r.Bodies {
			bs := &r.Bodies[i]
			px, sy := added(bs.Paths, "proxy"), added(bs.Paths, "switchyard")
			ok, _ := bodyVerdict(bs)
			errs := bs.Paths["direct"].Errors + bs.Paths["proxy"].Errors + bs.Paths["switchyard"].Errors + bs.Floor.Errors
			met := yes(ok)
			if bs.Load > indicativeLoad {
				met += " (indicative)"
			}
			p("| %d KB | %.2f | %s | %s | %s | %s | %s | %s | ≤ %s | %s | %d |\n", bs.KB, bs.Load, f3(bs.Paths["direct"].P50), f3(bs.Paths["proxy"].P50),
				f3(bs.Paths["switchyard"].P50), f3(bs.Floor.P50), signed(px), signed(sy), f3(bodyTarget(px, bs.Floor.P50)), met, errs)
		}
		p("\n")
		renderBodyStages(p, r.Bodies)
	}
	if c := r.Concurrency; c != nil {
		p("### Long prompts, %d at a time\n\n", c.Concurrency)
		p("%d workers each keep one streamed request of %d bytes (%d KB) in flight for %s, taking the three paths in turn, so all three share the same load. "+
			"Time to the first data line (TTFT), milliseconds; the target is Switchyard adding at most %s ms at p50; %s.\n\n",
			c.Concurrency, c.Bytes, c.KB, c.Duration.D(), f3(concTarget), loadNote(c.Load))
		p("| path | requests | errors | TTFT p50 | p90 | p99 | added p50 |\n|---|---:|---:|---:|---:|---:|---:|\n")
		for _, path := range pathNames {
			s := c.Paths[path]
			add := "—"
			if path != "direct" {
				add = signed(added(c.Paths, path))
			}
			p("| %s | %d | %d | %s | %s | %s | %s |\n", path, s.OK, s.Errors, f3(s.P50), f3(s.P90), f3(s.P99), add)
		}
		sy := added(c.Paths, "switchyard")
		p("\nSwitchyard adds %s ms to p50 TTFT (target ≤ %s ms: %s); the proxy adds %s ms.\n\n", signed(sy), f3(concTarget), yes(sy <= concTarget), signed(added(c.Paths, "proxy")))
	}
}

func yes(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

// renderBodyStages is the stage table of each size side by side (p50,
// milliseconds), against the floor's round of the same size.
func renderBodyStages(p func(string, ...any), bodies []bodySize) {
	var order []string
	for _, bs := range bodies {
		if bs.Stages == nil {
			return
		}
		for _, st := range bs.Stages.Stages {
			if !slices.Contains(order, st.Stage) {
				order = append(order, st.Stage)
			}
		}
	}
	if len(order) == 0 {
		return
	}
	p("Where Switchyard's time goes at each size: the stage table of its requests (p50 of each stage, the time since the stage before it, milliseconds), " +
		"against the floor. The request leg is the hop to \"adapter received\", the reply leg the hop to \"gateway first chunk received\"; " +
		"the client's figure above also holds the body's upload before \"gateway body received\" and the answer's download after the first byte.\n\n")
	p("| stage |")
	for _, bs := range bodies {
		p(" %d KB |", bs.KB)
	}
	p("\n|---|%s\n", strings.Repeat("---:|", len(bodies)))
	row := func(name string, v func(*bodySize) string) {
		p("| %s |", name)
		for i := range bodies {
			p(" %s |", v(&bodies[i]))
		}
		p("\n")
	}
	for _, name := range order {
		row(name, func(bs *bodySize) string {
			for _, st := range bs.Stages.Stages {
				if st.Stage == name {
					return fmt.Sprintf("%.3f", st.P50)
				}
			}
			return "—"
		})
	}
	row("**body received → first byte to the client**", func(bs *bodySize) string { return fmt.Sprintf("%.3f", bs.Stages.Total.P50) })
	row("nats-floor round (request, then every reply)", func(bs *bodySize) string { return f3(bs.Floor.P50) })
	row("bare NATS request and reply (256 B)", func(bs *bodySize) string { return fmt.Sprintf("%.3f", bs.Stages.BusFloor.P50) })
	p("\n")
}
