package lab

import (
	"fmt"
	"strings"
	"time"
)

// Staleness arms.
const (
	ArmRandom      = "random"
	ArmLeastLoaded = "least-loaded (global)"
	ArmUnguarded   = "power-of-two, no guard"
	ArmGuarded     = "Switchyard (stale_after 5s)"
)

// StalenessPoint is one arm at one staleness.
type StalenessPoint struct {
	Arm       string
	Staleness time.Duration
	Summary
}

// StalenessResult is the metric-freshness experiment.
type StalenessResult struct {
	Levels []time.Duration
	Arms   []string
	// Points by arm, then level. Random does not depend on staleness: its
	// one run is repeated at every level.
	Points map[string][]StalenessPoint
}

// Staleness routes load-aware on heartbeats that arrive late: each carries
// the load of its replica as it was Staleness ago. Arms: random; global
// least-loaded; the policy with the staleness guard disabled (stale_after
// 1h: power of two on whatever data it has); the policy as designed
// (stale_after 5s: random once every candidate's data is older, the data
// dated by sent_unix_ms since it arrives late). Single requests of widely spread sizes at about
// 85% of capacity, one router, dead_after raised so late heartbeats still
// count.
func Staleness(o Options) *StalenessResult {
	win := o.window(600*time.Second, 300*time.Second, 300*time.Second)
	levels := pick(o,
		[]time.Duration{time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second, 60 * time.Second, 300 * time.Second},
		[]time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 300 * time.Second},
		[]time.Duration{time.Second, 60 * time.Second})
	arms := []string{ArmLeastLoaded, ArmUnguarded, ArmGuarded}
	if o.Scale == Tiny {
		arms = []string{ArmUnguarded, ArmGuarded}
	}
	cluster := replicas("r", "general", 4, Profile())
	reps := 1
	// Heartbeats delayed by s carry no data from before the start: each run
	// first lives through s of history, then measures the same span.
	w := stalenessWorkload(win.horizon + levels[len(levels)-1])
	work := o.workloads("staleness", reps, func(int) Workload { return w })
	type cfg struct {
		arm string
		s   time.Duration
	}
	var cfgs []cfg
	for _, a := range append([]string{ArmRandom}, arms...) {
		for _, s := range levels {
			cfgs = append(cfgs, cfg{a, s})
		}
	}
	res := o.runGrid(len(cfgs), reps, func(i, k int) *Scenario {
		c := cfgs[i]
		stale := "5s"
		if c.arm == ArmUnguarded {
			stale = "1h"
		}
		snap := mustTable(cluster, map[string]any{"policy": map[string]any{"stale_after": stale, "dead_after": "1h"}})
		return &Scenario{
			Replicas: cluster, Requests: work[k], Warmup: win.warmup + c.s, Horizon: win.horizon + c.s, SLO: 2 * time.Second,
			Staleness: c.s,
			// Every arm draws the same random numbers (common random
			// numbers), so differences come from the routing alone.
			Seed: o.seed(hashName("staleness"), uint64(k)),
			NewPicker: func(r int) Picker {
				switch c.arm {
				case ArmRandom:
					return NewRandom(ids(cluster), snap.Policy)
				case ArmLeastLoaded:
					return NewLeastLoaded(ids(cluster), snap.Policy, true)
				}
				return NewSwitchyard(snap, fmt.Sprintf("broker-%d", r))
			},
		}
	})
	out := &StalenessResult{Levels: levels, Arms: append([]string{ArmRandom}, arms...), Points: map[string][]StalenessPoint{}}
	for i, c := range cfgs {
		out.Points[c.arm] = append(out.Points[c.arm], StalenessPoint{Arm: c.arm, Staleness: c.s, Summary: Pool(res[i], nil)})
	}
	return out
}

func stalenessWorkload(d time.Duration) Workload {
	return Workload{Rate: 7, Duration: d, UserTokens: 1500, OutputTokens: 250, SizeSigma: 1.0, Tenants: 4}
}

// Crossover is the smallest staleness at which arm's p99 TTFT is worse than
// random's, or 0 when it never is.
func (r *StalenessResult) Crossover(arm string) time.Duration {
	for i, p := range r.Points[arm] {
		if p.P99 > r.Points[ArmRandom][i].P99 {
			return p.Staleness
		}
	}
	return 0
}

// Section renders the experiment.
func (r *StalenessResult) Section() *Section {
	p99 := &Chart{File: "staleness-p99-ttft.png", Title: "p99 TTFT vs age of the load data",
		XLabel: "heartbeat delay: load data age (s, log scale)", YLabel: "p99 TTFT (ms, log scale)", LogX: true, LogY: true, LegendRight: true, LegendBottom: true}
	p50 := &Chart{File: "staleness-p50-ttft.png", Title: "p50 TTFT vs age of the load data",
		XLabel: "heartbeat delay: load data age (s, log scale)", YLabel: "p50 TTFT (ms, log scale)", LogX: true, LogY: true}
	var rows, md [][]string
	header := []string{"delay"}
	for _, a := range r.Arms {
		var x, y, y50 []float64
		for _, p := range r.Points[a] {
			x = append(x, p.Staleness.Seconds())
			y = append(y, p.P99)
			y50 = append(y50, p.P50)
			rows = append(rows, []string{a, fmt.Sprint(p.Staleness.Seconds()), ms(p.P50), ms(p.P99), f2(p.Goodput), f2(p.Offered), f3(p.StepShare("stale-random"))})
		}
		// Random is drawn wide: the guarded policy lies on it past stale_after.
		p99.Series = append(p99.Series, Series{Name: a, X: x, Y: y, Wide: a == ArmRandom})
		p50.Series = append(p50.Series, Series{Name: a, X: x, Y: y50, Wide: a == ArmRandom})
		header = append(header, a)
	}
	for i, s := range r.Levels {
		row := []string{s.String()}
		for _, a := range r.Arms {
			row = append(row, ms(r.Points[a][i].P99))
		}
		md = append(md, row)
	}
	rnd := r.Points[ArmRandom][0]
	var find strings.Builder
	for _, a := range []string{ArmUnguarded, ArmLeastLoaded} {
		if len(r.Points[a]) == 0 {
			continue
		}
		first := r.Points[a][0]
		if c := r.Crossover(a); c == first.Staleness {
			fmt.Fprintf(&find, "- **%s** is worse than random already with the freshest data (p99 %s ms vs %s ms at %s) and gets worse as the data ages.\n",
				a, ms(first.P99), ms(rnd.P99), first.Staleness)
		} else if c > 0 {
			fmt.Fprintf(&find, "- **%s** beats random with fresh data (p99 %s ms vs %s ms at %s) and **loses to random from %s of staleness on**.\n",
				a, ms(first.P99), ms(rnd.P99), first.Staleness, c)
		} else {
			fmt.Fprintf(&find, "- **%s** never loses to random in this range (p99 %s ms at %s vs random's %s ms).\n", a, ms(first.P99), first.Staleness, ms(rnd.P99))
		}
	}
	fmt.Fprintf(&find, "- **%s**: its p99 over random's, delay by delay: ", ArmGuarded)
	for i, p := range r.Points[ArmGuarded] {
		if i > 0 {
			find.WriteString(", ")
		}
		fmt.Fprintf(&find, "%s %.2f×", p.Staleness, r.GuardedRatio(i))
	}
	find.WriteString(".\n")
	worst := 0.0
	for i := range r.Levels {
		worst = max(worst, r.GuardedRatio(i))
	}
	fmt.Fprintf(&find, "  It is never worse than random (worst %.2f×): once the data is older than `stale_after` "+
		"it routes at random (%s of decisions `stale-random` at %s), and with the same random draws it makes the "+
		"very choices the random router makes.\n", worst,
		pct(r.Points[ArmGuarded][len(r.Levels)-1].StepShare("stale-random")), r.Levels[len(r.Levels)-1])
	return r.section(p99, p50, header, md, rows, find.String())
}

// headline sums up the experiment in one sentence.
func (r *StalenessResult) headline() string {
	h := "power of two without a guard "
	if c := r.Crossover(ArmUnguarded); c > 0 {
		h += fmt.Sprintf("loses to random from %s of staleness (p99 %s vs %s ms with 1 s)", c,
			ms(r.Points[ArmUnguarded][0].P99), ms(r.Points[ArmRandom][0].P99))
	} else {
		h += "never loses to random here"
	}
	if c := r.Crossover(ArmLeastLoaded); c > 0 && c == r.Levels[0] {
		h += fmt.Sprintf(", global least-loaded already at %s", c)
	} else if c > 0 {
		h += fmt.Sprintf(", global least-loaded from %s", c)
	}
	worst := 0.0
	for i := range r.Levels {
		worst = max(worst, r.GuardedRatio(i))
	}
	h += fmt.Sprintf("; Switchyard's stale_after guard stays at or below random (worst %.2f×)", worst)
	return h + "."
}

// GuardedRatio is the guarded policy's p99 TTFT over random's at level i.
func (r *StalenessResult) GuardedRatio(i int) float64 {
	return r.Points[ArmGuarded][i].P99 / r.Points[ArmRandom][i].P99
}

func (r *StalenessResult) section(p99, p50 *Chart, header []string, md, rows [][]string, find string) *Section {
	text := fmt.Sprintf(`**Question.** Routing on load data that is 1 s, 5 s, 30 s or 300 s old: at what staleness does
load-aware routing become worse than random, and does Switchyard's guard (`+"`stale_after`"+`: random
once every candidate's data is older) keep it from doing worse than random?

**Setup.** 4 replicas, one router, single requests at %.1f req/s (near capacity: random routing's
p99 TTFT is several seconds) with widely spread sizes (log-normal, σ = 1: prompts around 1500 tokens, answers around 250), so load
differs between replicas and knowing it pays. All arms draw the same random numbers (common random
numbers), so their differences come from the routing alone. Every heartbeat is delivered late by the delay on the
x axis; the router receives it late and, as the broker does, dates the load data by the older of
receipt and `+"`sent_unix_ms`"+` (liveness stays on its own clock). `+"`dead_after`"+` is 1 h
so late heartbeats still count. Each run first lives through one delay of history, then measures
the same span, so random's line moves a little with the delay only because the window does.

%s%s
p99 TTFT (ms) by delay:

%s
**Findings.**

%s
Stale load data herds: every request in a heartbeat interval sees the same old ranking, and the
in-flight count the policy adds (0.1/32 ≈ 0.003 of load_score per request sent) is small next to
what an admitted request of this workload weighs through kv_usage (1750/65 536 tokens × 0.6 ≈ 0.016),
so the replica that looked least loaded long ago takes a burst it cannot serve.
`, r.Points[ArmRandom][0].Offered, img(p99), img(p50), mdTable(header, md), find)
	return &Section{
		Name: "staleness", Title: "3. Staleness of load metrics", Text: text, Charts: []*Chart{p99, p50},
		Headline: r.headline(),
		Tables:   []*Table{{File: "staleness.csv", Header: []string{"arm", "delay_s", "p50_ttft_ms", "p99_ttft_ms", "goodput_rps", "offered_rps", "stale_random_share"}, Rows: rows}},
	}
}
