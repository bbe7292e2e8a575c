package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A verdict is one target of the bench judged: its line ends in " met" or
// " NOT met", or in " indicative" when the phase that measured it started
// on a busy machine (loadNote).
type verdict struct {
	Target     string `json:"target"`
	Met        bool   `json:"met"`
	Indicative bool   `json:"indicative,omitempty"`
}

func (v verdict) String() string {
	switch {
	case v.Indicative:
		return v.Target + ": indicative"
	case v.Met:
		return v.Target + ": met"
	}
	return v.Target + ": NOT met"
}

// cpuFloorFactor is how many floors of CPU Switchyard may spend per
// request beyond the proxy's.
const cpuFloorFactor = 1.3

// decideTarget is the most a decision among 64 candidates may take.
const decideTarget = 2 * time.Microsecond

// verdicts judges every target the run measured, in the section's order.
func verdicts(r *results) []verdict {
	var out []verdict
	if d := r.Decide; d != nil {
		out = append(out, verdict{
			Target: fmt.Sprintf("BenchmarkDecide/candidates=64: median %.0f ns of %d runs, at most %d allocations, under %s with 0 allocations",
				d.medianNs(), len(d.NsOp), d.Allocs, decideTarget),
			Met: d.medianNs() < float64(decideTarget.Nanoseconds()) && d.Allocs == 0, Indicative: d.Load > indicativeLoad,
		})
	}
	for i := range r.Bodies {
		bs := &r.Bodies[i]
		ok, line := bodyVerdict(bs)
		out = append(out, verdict{Target: line, Met: ok, Indicative: bs.Load > indicativeLoad})
	}
	if ns := r.NonStream; ns != nil && ns.Floor != nil && ns.PerPath > 0 {
		n := time.Duration(ns.PerPath)
		sy, px, fl := ns.CPU["stack"].total()/n, ns.CPU["proxy"].total()/n, ns.Floor.perRequest()
		limit := px + time.Duration(cpuFloorFactor*float64(fl))
		out = append(out, verdict{
			Target: fmt.Sprintf("%g req/s non-streamed: Switchyard's CPU per request %d µs, at most the proxy's %d + %.1f × the floor's %d = %d µs",
				r.Config.Rate, sy.Microseconds(), px.Microseconds(), cpuFloorFactor, fl.Microseconds(), limit.Microseconds()),
			Met: sy <= limit, Indicative: ns.Load > indicativeLoad || ns.Floor.Load > indicativeLoad,
		})
	}
	if r.Many != nil {
		out = append(out, manyVerdicts(r.Many)...)
	}
	return out
}

// manyVerdicts are the many-streams targets at the first rate (the target
// load), without busy loops.
func manyVerdicts(ph *manyPhase) []verdict {
	i := slices.IndexFunc(ph.Steps, func(s manyStep) bool { return s.Busy == 0 })
	if i < 0 || len(ph.Steps[i].Report.Targets) != 2 {
		return nil
	}
	s := &ph.Steps[i]
	px, sy := &s.Report.Targets[0], &s.Report.Targets[1]
	ind := s.Load > indicativeLoad
	head := fmt.Sprintf("~%d open streams", s.Open)
	out := []verdict{{
		Target: fmt.Sprintf("%s: %d errors (proxy %d), none", head, sy.Errors, px.Errors),
		Met:    sy.Errors == 0, Indicative: ind,
	}}
	if px.FirstData != nil && sy.FirstData != nil && px.Gaps != nil && sy.Gaps != nil {
		out = append(out,
			verdict{Target: fmt.Sprintf("%s: first-data p99 %s ms, at most the proxy's %s + %s", head, f3(sy.FirstData.P99), f3(px.FirstData.P99), manyFirstSlack),
				Met: (sy.FirstData.P99 - px.FirstData.P99).D() <= manyFirstSlack, Indicative: ind},
			verdict{Target: fmt.Sprintf("%s: chunk-gap p99 %s ms, at most the proxy's %s + %s", head, f3(sy.Gaps.P99), f3(px.Gaps.P99), manyGapSlack),
				Met: (sy.Gaps.P99 - px.Gaps.P99).D() <= manyGapSlack, Indicative: ind})
	}
	if rp, rs := s.RSS["proxy"], s.RSS["stack"]; rp > 0 {
		out = append(out, verdict{Target: fmt.Sprintf("%s: RSS %.0f MB, at most %g × the proxy's %.0f MB", head, rs, manyRSSRatio, rp),
			Met: rs <= manyRSSRatio*rp, Indicative: ind})
	}
	return out
}

// printVerdicts writes the verdict lines on stdout.
func printVerdicts(r *results) {
	for _, v := range verdicts(r) {
		fmt.Println(v)
	}
}

func renderVerdicts(p func(string, ...any), vs []verdict) {
	if len(vs) == 0 {
		return
	}
	p("### Verdicts\n\nOne line per target, as `make bench-e2e` prints them (a target measured in a phase that started on a busy machine is *indicative*, not judged):\n\n```\n")
	for _, v := range vs {
		p("%s\n", v)
	}
	p("```\n\n")
}

// decideBench is BenchmarkDecide/candidates=64, run by `go test`.
type decideBench struct {
	NsOp   []float64 `json:"ns_op"`
	Allocs int       `json:"allocs_op"` // the most of any run
	Load   float64   `json:"loadavg_start"`
}

func (d *decideBench) medianNs() float64 {
	if len(d.NsOp) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(d.NsOp))
	return s[len(s)/2]
}

// runDecideBench builds pkg's tests with the go tool ($GO, else go), then
// runs BenchmarkDecide/candidates=64 five times and reads its lines.
func (b *bench) runDecideBench(ctx context.Context, pkg string) (*decideBench, error) {
	goTool := os.Getenv("GO")
	if goTool == "" {
		goTool = "go"
	}
	fmt.Fprintf(os.Stderr, "== BenchmarkDecide/candidates=64 (%s)\n", pkg)
	// Built first, so that the build's burst is over when the machine
	// is let settle and the benchmark runs.
	dir, err := os.MkdirTemp("", "benche2e-decide-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "policy.test")
	build := exec.CommandContext(ctx, goTool, "test", "-c", "-o", bin, pkg)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return nil, fmt.Errorf("go test -c %s: %w", pkg, err)
	}
	d := &decideBench{Load: b.settle(ctx)}
	cmd := exec.CommandContext(ctx, bin, "-test.run", "^$", "-test.bench", "^BenchmarkDecide$/^candidates=64$", "-test.benchmem", "-test.count", "5")
	cmd.Dir = pkg // the package's own directory, as go test runs it
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("BenchmarkDecide: %w", err)
	}
	if err := d.parse(string(out)); err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "   median %.0f ns/op, %d allocs/op\n", d.medianNs(), d.Allocs)
	return d, nil
}

// parse reads `go test -bench -benchmem` lines of the benchmark.
func (d *decideBench) parse(out string) error {
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) < 8 || !strings.HasPrefix(f[0], "BenchmarkDecide/candidates=64") || f[3] != "ns/op" || f[7] != "allocs/op" {
			continue
		}
		ns, err1 := strconv.ParseFloat(f[2], 64)
		allocs, err2 := strconv.Atoi(f[6])
		if err1 != nil || err2 != nil {
			return fmt.Errorf("unreadable benchmark line %q", l)
		}
		d.NsOp = append(d.NsOp, ns)
		d.Allocs = max(d.Allocs, allocs)
	}
	if len(d.NsOp) == 0 {
		return fmt.Errorf("no BenchmarkDecide/candidates=64 line in the output")
	}
	return nil
}
