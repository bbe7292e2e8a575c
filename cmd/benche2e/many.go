package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/switchyard-llm/switchyard/internal/stages"
	"github.com/switchyard-llm/switchyard/loadgen"
)

// The many-streams phase: thousands of long streams open at once, as an
// LLM router holds them, through the proxy and Switchyard side by side. It
// has processes of its own: an engine with a realistic pace (TTFT and ITL
// of tens of milliseconds, a hundred tokens) and a Switchyard replica that
// declares room for every stream, so that admission is not what is
// measured.

type manyConfig struct {
	rates     []float64 // new streams a second per path; the first is the target load
	tokens    int
	ttft, itl time.Duration
	duration  time.Duration
	warmup    time.Duration
	capacity  int // max_batch and max_queue of the replica
	busy      int // busy loops beside the stack in one more step at the last rate
}

// manyStep is one rate of the phase.
type manyStep struct {
	Rate float64 `json:"rate"`
	// Busy is how many busy loops spun beside the processes for the step.
	Busy int `json:"busy_loops,omitempty"`
	// Open is about how many streams each path holds open at once:
	// rate × (TTFT + tokens × ITL).
	Open   int             `json:"open_streams"`
	Report *loadgen.Report `json:"report"`
	// RSS is the peak resident set of each process during the step, MB.
	RSS map[string]float64 `json:"rss_mb"`
	CPU map[string]cpuUse  `json:"cpu"`
	// Met says whether Switchyard met the targets against the proxy, and
	// Why not.
	Met bool   `json:"met"`
	Why string `json:"why,omitempty"`
	// Failures says how Switchyard failed its requests, and FailuresMet
	// whether that is within the rule of judgeFailures.
	Failures    string `json:"failures"`
	FailuresMet bool   `json:"failures_met"`
	// Load is the 1-minute load average the rate started at; Stages the
	// stage table of Switchyard's streams at this rate.
	Load   float64         `json:"loadavg_start"`
	Stages *stages.Summary `json:"stages,omitempty"`
	// Goroutines are the Switchyard process's goroutines halfway through
	// the rate, by the part whose function they run (goroutines.go).
	Goroutines map[string]int `json:"goroutines,omitempty"`
}

type manyPhase struct {
	Date      string      `json:"date"`
	LoadStart string      `json:"loadavg_start"`
	Tokens    int         `json:"tokens"`
	TTFT      loadgen.Dur `json:"ttft_ms"`
	ITL       loadgen.Dur `json:"itl_ms"`
	Duration  loadgen.Dur `json:"duration_ms"`
	Capacity  int         `json:"replica_capacity"`
	Steps     []manyStep  `json:"steps"`
}

// Targets of Switchyard against the proxy at the same load.
const (
	manyFirstSlack = 50 * time.Millisecond // first data p99
	manyGapSlack   = 20 * time.Millisecond // chunk gap p99
	manyRSSRatio   = 2.0
)

// many runs the phase: its own engine, proxy and stack, every rate in turn.
func (b *bench) many(ctx context.Context, exe string) (*manyPhase, error) {
	mc := b.cfg.many
	m := describeMachine()
	ph := &manyPhase{Date: m.Date, LoadStart: m.LoadStart, Tokens: mc.tokens, TTFT: loadgen.Dur(mc.ttft), ITL: loadgen.Dur(mc.itl), Duration: loadgen.Dur(mc.duration), Capacity: mc.capacity}
	common := []string{"-model", b.cfg.model, "-ttft", mc.ttft.String(), "-itl", mc.itl.String(),
		"-max-batch", strconv.Itoa(mc.capacity), "-max-queue", strconv.Itoa(mc.capacity)}
	procs := map[string]*child{}
	defer func() {
		for _, c := range procs {
			_ = c.stop()
		}
	}()
	eng, err := startChild(ctx, exe, "many-engine", append([]string{"-role", "engine"}, common...)...)
	if err != nil {
		return nil, err
	}
	procs["engine"] = eng
	for _, role := range []string{"proxy", "stack"} {
		c, err := startChild(ctx, exe, "many-"+role, append([]string{"-role", role, "-engine", eng.urls[0]}, common...)...)
		if err != nil {
			return nil, err
		}
		procs[role] = c
	}
	urls := []string{procs["proxy"].urls[0], procs["stack"].urls[0]}
	ctl := ""
	if u := procs["stack"].urls; len(u) > 1 {
		ctl = u[1]
	}
	names := []string{"proxy", "switchyard"}
	open := func(rate float64) int {
		return int(rate * (mc.ttft + time.Duration(mc.tokens)*mc.itl).Seconds())
	}
	type stepPlan struct {
		rate float64
		busy int
	}
	var plan []stepPlan
	for _, r := range mc.rates {
		plan = append(plan, stepPlan{rate: r})
	}
	if mc.busy > 0 && len(mc.rates) > 0 {
		plan = append(plan, stepPlan{rate: mc.rates[len(mc.rates)-1], busy: mc.busy})
	}
	for i, st := range plan {
		rate := st.rate
		fmt.Fprintf(os.Stderr, "== many streams: %g new streams/s per path (~%d open each), %d tokens, %s, %d busy loops beside\n", rate, open(rate), mc.tokens, mc.duration, st.busy)
		s := manyStep{Rate: rate, Busy: st.busy, Open: open(rate), CPU: map[string]cpuUse{}, Load: b.settle(ctx)}
		var busy *child
		if st.busy > 0 {
			var err error
			if busy, err = startChild(ctx, exe, "many-busy", "-role", "busy", "-many-busy", strconv.Itoa(st.busy)); err != nil {
				return ph, err
			}
		}
		b.resetStages(ctx, ctl)
		before := cpuOf(procs)
		stopRSS := sampleRSS(procs, &s.RSS)
		var wg sync.WaitGroup
		mid, cancelMid := context.WithCancel(ctx)
		if ctl != "" {
			wg.Go(func() {
				select {
				case <-mid.Done():
					return
				case <-time.After(mc.warmup + mc.duration/2):
				}
				if err := b.getJSON(mid, ctl+"/goroutines", &s.Goroutines); err != nil {
					fmt.Fprintln(os.Stderr, "goroutines:", err)
				}
				if b.cfg.cpuProfile != "" && i > 0 {
					// Beside the fixed phase's CPU profile: the heap at
					// this moment, then five seconds of CPU. Not in the
					// first rate, whose figures the targets judge.
					name := filepath.Join(filepath.Dir(b.cfg.cpuProfile), "many-"+strings.ReplaceAll(rateLabel(s), " ", "-"))
					if err := fetchTo(mid, ctl+"/heap", name+".heap.pprof"); err != nil {
						fmt.Fprintln(os.Stderr, "heap profile:", err)
					}
					if err := fetchTo(mid, ctl+"/cpu?seconds=5", name+".cpu.pprof"); err != nil {
						fmt.Fprintln(os.Stderr, "cpu profile:", err)
					}
				}
			})
		}
		rep, err := loadgen.Run(ctx, loadgen.Config{
			Targets: urls, Names: names, Rate: rate, Duration: mc.duration, Warmup: mc.warmup,
			Stream: true, MaxTokens: mc.tokens, Model: b.cfg.model,
			Timeout: mc.ttft + time.Duration(mc.tokens)*mc.itl + 30*time.Second, Client: b.client,
		})
		stopRSS()
		cancelMid()
		wg.Wait()
		if busy != nil {
			_ = busy.stop()
		}
		b.client.CloseIdleConnections()
		if err != nil {
			return ph, err
		}
		for k, v := range cpuOf(procs) {
			s.CPU[k] = v.minus(before[k])
		}
		_ = rep.WriteText(os.Stderr)
		s.Report = rep
		s.Stages = b.stageTable(ctx, ctl)
		s.Met, s.Why = judgeMany(rep, s.RSS)
		s.FailuresMet, s.Failures = judgeFailures(rep, i == 0)
		fmt.Fprintf(os.Stderr, "RSS MB %v; targets met: %v %s; failures: %s (met: %v)\n", s.RSS, s.Met, s.Why, s.Failures, s.FailuresMet)
		ph.Steps = append(ph.Steps, s)
	}
	return ph, nil
}

func cpuOf(procs map[string]*child) map[string]cpuUse {
	m := map[string]cpuUse{}
	for name, c := range procs {
		if d, err := c.cpuTime(); err == nil {
			m[name] = d
		}
	}
	return m
}

// sampleRSS records each process's peak resident set (MB) into *peak,
// every 200ms, until the returned stop is called.
func sampleRSS(procs map[string]*child, peak *map[string]float64) (stop func()) {
	m := map[string]float64{}
	*peak = m
	done := make(chan struct{})
	var mu sync.Mutex
	var wg sync.WaitGroup
	read := func() {
		mu.Lock()
		defer mu.Unlock()
		for name, c := range procs {
			if mb, err := rssMB(c.cmd.Process.Pid); err == nil && mb > m[name] {
				m[name] = mb
			}
		}
	}
	wg.Go(func() {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			read()
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	})
	return func() { close(done); wg.Wait(); read() }
}

// rssMB reads VmRSS from /proc/<pid>/status.
func rssMB(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) >= 1 {
				kb, err := strconv.ParseFloat(f[0], 64)
				return kb / 1024, err
			}
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// judgeMany says whether Switchyard (the second target) met the targets
// against the proxy (the first): first data p99 within 20 ms, chunk gap
// p99 within 10 ms, RSS at most twice, and no error.
func judgeMany(rep *loadgen.Report, rss map[string]float64) (bool, string) {
	if len(rep.Targets) != 2 {
		return false, "two paths expected"
	}
	px, sy := &rep.Targets[0], &rep.Targets[1]
	var why []string
	if sy.Errors > 0 || px.Errors > 0 {
		why = append(why, fmt.Sprintf("errors: proxy %d, switchyard %d %v", px.Errors, sy.Errors, sy.ErrorsBy))
	}
	if px.FirstData == nil || sy.FirstData == nil || sy.OK == 0 {
		return false, strings.Join(append(why, "no stream measured"), "; ")
	}
	if d := sy.FirstData.P99 - px.FirstData.P99; d.D() > manyFirstSlack {
		why = append(why, fmt.Sprintf("first data p99 +%.1f ms over the proxy (target ≤ +%s)", d.Ms(), manyFirstSlack))
	}
	if d := sy.Gaps.P99 - px.Gaps.P99; d.D() > manyGapSlack {
		why = append(why, fmt.Sprintf("chunk gap p99 +%.1f ms over the proxy (target ≤ +%s)", d.Ms(), manyGapSlack))
	}
	if rss["proxy"] > 0 && rss["stack"] > manyRSSRatio*rss["proxy"] {
		why = append(why, fmt.Sprintf("RSS %.0f MB, %.1f× the proxy's %.0f MB (target ≤ %g×)", rss["stack"], rss["stack"]/rss["proxy"], rss["proxy"], manyRSSRatio))
	}
	return len(why) == 0, strings.Join(why, "; ")
}

// judgeFailures reads Switchyard's failures (the second target): at the
// first rate, the target load, none may fail; past it, the only failure
// allowed is a refusal `gateway_overloaded` that says when to come back
// (Retry-After): never `no_replicas`, a 504, a timeout or a cut stream.
func judgeFailures(rep *loadgen.Report, first bool) (bool, string) {
	if len(rep.Targets) != 2 {
		return false, "two paths expected"
	}
	sy := &rep.Targets[1]
	if sy.Errors == 0 {
		return true, "none"
	}
	over := sy.CodesBy["gateway_overloaded"]
	desc := fmt.Sprintf("%d of %d: %v", sy.Errors, sy.Sent, sy.ErrorsBy)
	if len(sy.CodesBy) > 0 {
		desc += fmt.Sprintf(", refusals by code %v", sy.CodesBy)
	}
	if sy.NoRetryAfter > 0 {
		desc += fmt.Sprintf(", %d without Retry-After", sy.NoRetryAfter)
	}
	if first {
		return false, desc + " (none allowed at the target load)"
	}
	if over != sy.Errors || sy.NoRetryAfter > 0 {
		return false, desc + " (only `gateway_overloaded` with Retry-After allowed past the target load)"
	}
	return true, desc
}

// renderMany is the phase's part of the section.
func renderMany(b *strings.Builder, ph *manyPhase) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p("### Many open streams\n\n")
	p("Run %s, load average at the start %s. ", ph.Date, ph.LoadStart)
	p("A process set of its own: an engine at TTFT %s and %s between tokens, %d tokens an answer; the proxy; Switchyard with a replica "+
		"declaring max_batch and max_queue %d (admission is not what is measured). The proxy and Switchyard interleaved, each at the full rate "+
		"of new streams, %s per rate after a warmup. "+
		"Targets, Switchyard against the proxy in the same run: first data p99 ≤ +%s, chunk gap p99 ≤ +%s, RSS ≤ %g×, no error. "+
		"Switchyard's failures: none at the first rate (the target load); past it, only refusals `gateway_overloaded` with Retry-After "+
		"(never `no_replicas`, a 504, a timeout or a cut stream). A rate \"with N busy loops\" runs again with a process spinning N threads "+
		"beside the others for the whole step, a starved machine. "+
		"RSS is each process's peak during the rate (Switchyard's process holds the NATS server, broker, gateway and adapter). Milliseconds.\n\n",
		ph.TTFT.D(), ph.ITL.D(), ph.Tokens, ph.Capacity, ph.Duration.D(), manyFirstSlack, manyGapSlack, manyRSSRatio)
	p("| new streams/s | open at once | path | ok | errors | first data p50 | first data p99 | gap p50 | gap p99 | gap max | RSS MB | CPU s |\n")
	p("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	procOf := map[string]string{"proxy": "proxy", "switchyard": "stack"}
	for _, s := range ph.Steps {
		for i := range s.Report.Targets {
			t := &s.Report.Targets[i]
			if t.FirstData == nil || t.Gaps == nil {
				continue
			}
			proc := procOf[t.Name]
			p("| %s | ~%d | %s | %d | %s | %s | %s | %s | %s | %s | %.0f | %.1f |\n", rateLabel(s), s.Open, t.Name, t.OK, errs(t),
				f3(t.FirstData.P50), f3(t.FirstData.P99), f3(t.Gaps.P50), f3(t.Gaps.P99), f3(t.Gaps.Max), s.RSS[proc], s.CPU[proc].total().Seconds())
		}
	}
	p("\n")
	for _, s := range ph.Steps {
		verdict := "targets met"
		if !s.Met {
			verdict = "missed: " + s.Why
		}
		lag := ""
		if len(s.Report.Targets) > 0 {
			lag = fmt.Sprintf(" (the generator sent p99 %s ms late: a measure of how starved the machine was)", f3(s.Report.Targets[0].SendLag.P99))
		}
		failures := "met"
		if !s.FailuresMet {
			failures = "NOT met"
		}
		p("- %s/s (~%d open)%s, %s: %s%s; Switchyard's failures %s: %s.\n", rateLabel(s), s.Open, lag, loadNote(s.Load), verdict, indicativeNote(s.Load), s.Failures, failures)
	}
	p("\n")
	for _, s := range ph.Steps {
		if len(s.Goroutines) > 0 {
			p("- %s/s: Switchyard's goroutines halfway through (~%d streams open), by the part whose function they run: %s.\n", rateLabel(s), s.Open, perStream(s.Goroutines, s.Open))
		}
	}
	p("\n")
	for _, s := range ph.Steps {
		renderStages(p, fmt.Sprintf("%s new streams/s", rateLabel(s)), s.Stages)
	}
}

// rateLabel names a step by its rate, and the busy loops beside it.
func rateLabel(s manyStep) string {
	if s.Busy > 0 {
		return fmt.Sprintf("%g with %d busy loops", s.Rate, s.Busy)
	}
	return fmt.Sprintf("%g", s.Rate)
}
