package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/switchyard-llm/switchyard/loadgen"
)

const (
	markStart = "<!-- bench-e2e:start -->"
	markEnd   = "<!-- bench-e2e:end -->"
	// The many-streams phase has a section of its own, so that it can be
	// rerun alone (-only-many) without the other phases.
	manyStart = "<!-- bench-e2e-many:start -->"
	manyEnd   = "<!-- bench-e2e-many:end -->"
)

type machine struct {
	NumCPU    int    `json:"nproc"`
	CPU       string `json:"cpu"`
	Kernel    string `json:"kernel"`
	Go        string `json:"go"`
	Date      string `json:"date"`
	LoadStart string `json:"loadavg_start"`
}

func describeMachine() machine {
	m := machine{NumCPU: runtime.NumCPU(), Go: runtime.Version(), Date: time.Now().UTC().Format("2006-01-02 15:04 MST")}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	m.Kernel = readTrim("/proc/sys/kernel/osrelease")
	m.LoadStart = loadavg()
	return m
}

func readTrim(path string) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b))
}

// loadavg is the 1, 5 and 15 minute load averages.
func loadavg() string {
	f := strings.Fields(readTrim("/proc/loadavg"))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// rerender rewrites the section from the results of an earlier run.
func rerender(jsonPath, out string) error {
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		return err
	}
	var r results
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("%s: %w", jsonPath, err)
	}
	if r.Many != nil {
		if err := writeManySection(out, r.Many); err != nil {
			return err
		}
	}
	return writeSection(out, render(&r))
}

// writeSection replaces the text between the markers in path (appending
// the section when the markers are absent, creating the file when it is).
func writeSection(path, section string) error {
	return writeBetween(path, markStart, markEnd, section)
}

// writeManySection writes the many-streams phase between its markers.
func writeManySection(path string, ph *manyPhase) error {
	var b strings.Builder
	renderMany(&b, ph)
	return writeBetween(path, manyStart, manyEnd, b.String())
}

func writeBetween(path, start, end, section string) error {
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return os.WriteFile(path, replaceBetween(old, start, end, section), 0o644)
}

func replaceSection(doc []byte, section string) []byte {
	return replaceBetween(doc, markStart, markEnd, section)
}

func replaceBetween(doc []byte, markStart, markEnd, section string) []byte {
	block := markStart + "\n" + strings.TrimSpace(section) + "\n" + markEnd
	if len(bytes.TrimSpace(doc)) == 0 {
		return []byte("# Benchmarks\n\n" + block + "\n")
	}
	i := bytes.Index(doc, []byte(markStart))
	j := bytes.Index(doc, []byte(markEnd))
	if i < 0 || j < i {
		return append(append(bytes.TrimRight(doc, "\n"), "\n\n"...), block+"\n"...)
	}
	out := append([]byte(nil), doc[:i]...)
	out = append(out, block...)
	return append(out, doc[j+len(markEnd):]...)
}

func f3(d loadgen.Dur) string     { return fmt.Sprintf("%.3f", d.Ms()) }
func signed(d loadgen.Dur) string { return fmt.Sprintf("%+.3f", d.Ms()) }

// render is the Markdown of the section, between the markers.
func render(r *results) string {
	var b strings.Builder
	m, c := r.Machine, r.Config
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("## End to end: direct, reverse proxy, Switchyard\n\n")
	p("Written by `make bench-e2e` (`cmd/benche2e`, run %s, %s in all). ", m.Date, r.Elapsed.D().Round(time.Second))
	p("Machine: %d × %s (`nproc` %d), Linux %s, %s; load average at the start %s. ", m.NumCPU, m.CPU, m.NumCPU, m.Kernel, m.Go, m.LoadStart)
	p("Each phase says the load average it started at; on these %d cores a phase that started above %.1f shared the machine with other work and is marked **indicative**: "+
		"compare paths within one run, and judge targets on the phases that were not.\n\n", m.NumCPU, indicativeLoad)
	p("Setup, each in its own process: the engine simulator in fixed mode (TTFT %s, then %d tokens %s apart, whatever the load; "+
		"Go timers on an idle machine round sub-millisecond waits up to about 1 ms, so the gaps the direct path shows are the real ITL); "+
		"`httputil.ReverseProxy` in front of it (FlushInterval −1, a tuned transport): the router that decides nothing; "+
		"Switchyard in front of it as `switchyard dev` runs it (embedded NATS, one broker, the gateway deciding in its own process, one adapter, the dev routing table); "+
		"and the load generator (`loadgen`, as in `switchyard bench`). Open loop: every request is sent at its scheduled time however slow the "+
		"answers, and latency counts from the scheduled time. Requests: model `%s`, max_tokens %d, one short message.\n\n",
		c.TTFT.D(), c.MaxTokens, c.ITL.D(), c.Model, c.MaxTokens)
	renderVerdicts(p, verdicts(r))

	if ns := r.NonStream; ns != nil {
		p("### %g requests/s per path, non-stream, %s\n\n", c.Rate, c.Duration.D())
		p("The three paths interleaved slot by slot, each at the full rate (%g/s on the machine in all), same window; %s. Milliseconds.\n\n", 3*c.Rate, loadNote(ns.Load))
		fixedTable(&b, ns, false)
		if sy, px := ns.Report.Diffs, ns.CPU; len(sy) == 2 && px["proxy"].total() > 0 && ns.PerPath > 0 {
			cpuRatio := px["stack"].total().Seconds() / px["proxy"].total().Seconds()
			addOK := sy[1].Latency.P50 <= 2*sy[0].Latency.P50
			p("Targets: Switchyard's added p50 at most 2 × the proxy's (%s: %s); CPU per request at most 1.5 × the proxy's (×%.2f: %s)%s.\n\n",
				signed(sy[1].Latency.P50), yes(addOK), cpuRatio, yes(cpuRatio <= 1.5), indicativeNote(ns.Load))
		}
		if fl := ns.Floor; fl != nil && fl.Run.Requests > 0 {
			p("The bus floor (`nats-floor`, the legs of the phase's last Switchyard request) alone at %g/s after the paths (%s): %d rounds, %d errors, "+
				"p50 %s ms, p99 %s ms; CPU per round %d µs: its process %s, the NATS server's share %s (Switchyard's process over the run, less its CPU at rest read for %s before it, %s scaled to the run). "+
				"Target: Switchyard's CPU per request at most the proxy's plus %.1f × the floor's (see the verdicts).\n\n",
				c.Rate, loadNote(fl.Load), fl.Run.Requests, fl.Run.Errors, f3(fl.Run.P50), f3(fl.Run.P99), fl.perRequest().Microseconds(),
				perRequest(fl.CPU, float64(fl.Run.Requests)), perRequest(fl.ServerCPU, float64(fl.Run.Requests)), floorIdle,
				fmt.Sprintf("%.0f ms", fl.IdleCPU.total().Seconds()*1000), cpuFloorFactor)
		}
		renderStages(p, "non-stream at the fixed rate", ns.Stages)
	}
	if st := r.Stream; st != nil {
		p("### %g requests/s per path, stream, %s\n\n", c.Rate, c.Duration.D())
		p("Gaps are between successive SSE data lines as the client reads them (`[DONE]` included); %s.\n\n", loadNote(st.Load))
		fixedTable(&b, st, true)
		renderStages(p, "stream at the fixed rate", st.Stages)
	}
	renderBodies(p, r)
	if len(r.Steps) > 0 {
		p("### Highest rate held with p99 under %s (non-stream)\n\n", c.P99Limit.D())
		p("Each path alone, %s per step after a warmup, steps in order until the first that fails (p99 ≥ %s or more than 0.1%% errors), "+
			"then up to %d steps halving the interval between the last rate held and the lowest failed. "+
			"The load generator shares the two cores, so at high rates it competes with the path it measures; %s.\n\n", c.StepDuration.D(), c.P99Limit.D(), c.StepBisect, loadNote(r.StepsLoad))
		p("| path | highest rate held | lowest failing step |\n|---|---:|---|\n")
		for _, path := range pathNames {
			fail := r.StepsEnded[path]
			low := math.Inf(1)
			for _, s := range r.Steps {
				if s.Path == path && !s.Held && s.Rate < low {
					low, fail = s.Rate, fmt.Sprintf("%g/s: %s", s.Rate, s.Why)
				}
			}
			p("| %s | %g/s | %s |\n", path, r.MaxHeld[path], fail)
		}
		p("\n| rate/s | path | p50 | p99 | errors | generator lag p99 |\n|---:|---|---:|---:|---:|---:|\n")
		for _, s := range r.Steps {
			p("| %g | %s | %s | %s | %.2f%% | %s |\n", s.Rate, s.Path, f3(s.P50), f3(s.P99), 100*s.ErrorRate, f3(s.SendLag))
		}
		p("\n")
		renderOverload(p, r.Overload)
	}
	if r.ProfileTop != "" {
		p("### Where Switchyard's time goes\n\n")
		p("CPU profile of the Switchyard process (gateway, broker, adapter, dashboard and the embedded NATS server) during the non-stream phase at %g/s, warmup included. ", c.Rate)
		if ns := r.NonStream; ns != nil {
			p("Its samples stand for %s of CPU; /proc counts %.2fs for the process over the phase. On an overloaded machine the profiler misses samples "+
				"and the split between parts moves by several points from run to run: trust the CPU per request from /proc over the split.",
				profileTotal(r.ProfileTop), ns.CPU["stack"].total().Seconds())
		}
		p("\n\n")
		p("For scale: a request through Switchyard crosses loopback TCP eight times (client → gateway → NATS server → adapter → engine, " +
			"and engine → adapter → NATS server → gateway → client; two more through a broker with `--decide broker`), besides the usage and sampled-decision messages; through the proxy, four times.\n\n")
		if len(r.ProfileParts) > 0 {
			p("Share of the samples whose stack passes through each part (a sample can count in several rows):\n\n| part | share of CPU |\n|---|---:|\n")
			for _, pp := range r.ProfileParts {
				p("| %s | %.1f%% |\n", pp.Part, pp.Share)
			}
			p("\n")
		}
		p("<details><summary>go tool pprof -top (flat, then cumulative)</summary>\n\n```\n%s```\n\n</details>\n", r.ProfileTop)
	}
	return b.String()
}

func fixedTable(b *strings.Builder, ph *fixedPhase, stream bool) {
	rep := ph.Report
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	n := float64(ph.PerPath)
	p("| path | ok | errors | p50 | p90 | p99 | max |")
	if stream {
		p(" first data p50 | gap p50 | gap p99 |")
	}
	p(" added p50 | added p99 | CPU/request |\n|---|---:|---:|---:|---:|---:|---:|")
	if stream {
		p("---:|---:|---:|")
	}
	p("---:|---:|---:|\n")
	cpuOf := map[string]string{"direct": "", "proxy": "proxy", "switchyard": "stack"}
	for i := range rep.Targets {
		t := &rep.Targets[i]
		l := &t.Latency
		p("| %s | %d | %s | %s | %s | %s | %s |", t.Name, t.OK, errs(t), f3(l.P50), f3(l.P90), f3(l.P99), f3(l.Max))
		if stream && t.Gaps != nil {
			p(" %s | %s | %s |", f3(t.FirstData.P50), f3(t.Gaps.P50), f3(t.Gaps.P99))
		}
		add50, add99, cpu := "—", "—", "—"
		if i > 0 {
			d := rep.Diffs[i-1]
			add50, add99 = signed(d.Latency.P50), signed(d.Latency.P99)
		}
		if proc := cpuOf[t.Name]; proc != "" && n > 0 {
			cpu = perRequest(ph.CPU[proc], n)
		}
		p(" %s | %s | %s |\n", add50, add99, cpu)
	}
	p("\n")
	if len(rep.Diffs) == 2 {
		sy, px := rep.Diffs[1], rep.Diffs[0]
		p("Switchyard adds %s ms at p50 and %s ms at p99 over direct; the reverse proxy adds %s ms and %s ms. ",
			signed(sy.Latency.P50), signed(sy.Latency.P99), signed(px.Latency.P50), signed(px.Latency.P99))
		p("Switchyard over proxy, in added latency: ×%s at p50, ×%s at p99; in total latency over direct: ×%.2f at p50, ×%.2f at p99.",
			ratio(sy.Latency.P50, px.Latency.P50), ratio(sy.Latency.P99, px.Latency.P99), sy.RatioP50, sy.RatioP99)
		if stream && sy.Gaps != nil && px.Gaps != nil {
			p(" Inter-chunk gap over direct at p50: Switchyard %s ms, proxy %s ms (p99: %s ms, %s ms).",
				signed(sy.Gaps.P50), signed(px.Gaps.P50), signed(sy.Gaps.P99), signed(px.Gaps.P99))
		}
		p("\n\n")
	}
	n3 := 3 * n
	p("CPU per request (user + system, from /proc): the Switchyard and proxy processes over their own requests (warmup included); "+
		"the engine %s and the generator %s over all three paths'. ", perRequest(ph.CPU["engine"], n3), perRequest(ph.CPU["generator"], n3))
	lag := rep.Targets[0].SendLag
	p("Generator lateness against the schedule: p50 %s ms, p99 %s ms (it counts in every path's latency alike).\n\n", f3(lag.P50), f3(lag.P99))
}

// perRequest is CPU time per request in µs, with the system share.
func perRequest(c cpuUse, n float64) string {
	if n <= 0 || c.total() <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.0f µs (%.0f%% sys)", c.total().Seconds()*1e6/n, 100*c.Sys.D().Seconds()/c.total().Seconds())
}

func errs(t *loadgen.TargetReport) string {
	if t.Errors == 0 {
		return "0"
	}
	return fmt.Sprintf("%d %v", t.Errors, t.ErrorsBy)
}

func ratio(a, b loadgen.Dur) string {
	if b <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f", float64(a)/float64(b))
}
