package lab

import (
	"fmt"
	"strings"
	"time"
)

// CascadePoint is one offered load under one way of treating saturated
// replicas.
type CascadePoint struct {
	Exclude   bool
	Heartbeat time.Duration
	Rate      float64
	Summary
}

// CascadeResult compares deprioritizing saturated replicas (the policy)
// with excluding them, under increasing load.
type CascadeResult struct {
	Heartbeats []time.Duration
	Rates      []float64
	// Points by heartbeat, then arm (0 deprioritize, 1 exclude), then rate.
	Points [][2][]CascadePoint
	// Rotation is, in the exclude arm at TimelineRate with the slowest
	// load view, how many replicas were in rotation over time.
	TimelineRate float64
	Rotation     *rotation
}

// rotation records how many replicas the exclude arm's router keeps as
// candidates, heartbeat by heartbeat.
type rotation struct {
	excluded map[string]bool
	t        []float64 // seconds
	n        []float64 // replicas in rotation
	total    int
}

func (r *rotation) trace(now time.Time, replica string, excluded bool) {
	r.excluded[replica] = excluded
	in := 0
	for _, x := range r.excluded {
		if !x {
			in++
		}
	}
	r.t = append(r.t, now.Sub(Epoch()).Seconds())
	r.n = append(r.n, float64(in+r.total-len(r.excluded)))
}

// mean is the time-weighted mean of replicas in rotation in [from, to)
// seconds.
func (r *rotation) mean(from, to float64) float64 {
	sum := 0.0
	for i := range r.t {
		end := to
		if i+1 < len(r.t) {
			end = min(r.t[i+1], to)
		}
		if start := max(r.t[i], from); end > start {
			sum += r.n[i] * (end - start)
		}
	}
	return sum / (to - from)
}

// zeroShare is the share of time in [from, to) seconds with no replica in
// rotation.
func (r *rotation) zeroShare(from, to float64) float64 {
	zero := 0.0
	for i := range r.t {
		end := to
		if i+1 < len(r.t) {
			end = min(r.t[i+1], to)
		}
		if start := max(r.t[i], from); r.n[i] == 0 && end > start {
			zero += end - start
		}
	}
	return zero / (to - from)
}

// Cascade offers increasing load to 4 replicas whose KV cache is the
// binding limit (2048 blocks, 2000-token prompts, short answers), with the
// policy as it is (saturated replicas deprioritized) and with saturated
// replicas excluded (ExcludeSaturated). It runs once with heartbeats every
// second and once with a load view refreshed every 5 s (metrics scraped
// every 5 s, the slow end of common Prometheus scrape intervals).
func Cascade(o Options) *CascadeResult {
	win := o.window(600*time.Second, 240*time.Second, 400*time.Second)
	reps := pick(o, 2, 1, 1)
	rates := pick(o, []float64{6, 8, 10, 11, 12, 13, 14, 16, 18}, []float64{6, 8, 10, 12, 14, 16, 18}, []float64{10, 11, 12, 13})
	hbs := pick(o, []time.Duration{time.Second, 5 * time.Second}, []time.Duration{time.Second, 5 * time.Second}, []time.Duration{5 * time.Second})
	eng := Profile()
	eng.KVBlocks, eng.MaxQueue = 2048, 16
	cluster := replicas("r", "general", 4, eng)
	out := &CascadeResult{Heartbeats: hbs, Rates: rates, TimelineRate: 12,
		Rotation: &rotation{excluded: map[string]bool{}, total: len(cluster)}}
	work := make([][][]*Request, len(rates))
	for i, rate := range rates {
		w := cascadeWorkload(rate, win.horizon)
		work[i] = o.workloads(fmt.Sprint("cascade", i), reps, func(int) Workload { return w })
	}
	type cfg struct {
		hb      time.Duration
		exclude bool
		rate    int
	}
	var cfgs []cfg
	for _, hb := range hbs {
		for _, ex := range []bool{false, true} {
			for i := range rates {
				cfgs = append(cfgs, cfg{hb, ex, i})
			}
		}
	}
	res := o.runGrid(len(cfgs), reps, func(i, k int) *Scenario {
		c := cfgs[i]
		var rot *rotation
		if k == 0 && c.exclude && c.hb == hbs[len(hbs)-1] && rates[c.rate] == out.TimelineRate {
			rot = out.Rotation
		}
		return cascadeScenario(o, cluster, work[c.rate][k], win, c.hb, c.exclude, uint64(k), rot)
	})
	out.Points = make([][2][]CascadePoint, len(hbs))
	for i, c := range cfgs {
		h := indexOf(hbs, c.hb)
		arm := 0
		if c.exclude {
			arm = 1
		}
		out.Points[h][arm] = append(out.Points[h][arm], CascadePoint{Exclude: c.exclude, Heartbeat: c.hb, Rate: rates[c.rate], Summary: Pool(res[i], nil)})
	}
	return out
}

func cascadeWorkload(rate float64, d time.Duration) Workload {
	return Workload{Rate: rate, Duration: d, UserTokens: 2000, OutputTokens: 40, SizeSigma: 0.6, Tenants: 4}
}

func cascadeScenario(o Options, cluster []Replica, reqs []*Request, win window, hb time.Duration, exclude bool, i uint64, rot *rotation) *Scenario {
	// A slower load view needs a staleness guard to match, or every
	// heartbeat would look stale before the next arrives.
	stale, dead := 5*time.Second, 15*time.Second
	if hb > time.Second {
		stale, dead = 2*hb+time.Second, 6*hb
	}
	snap := mustTable(cluster, map[string]any{"policy": map[string]any{"stale_after": stale.String(), "dead_after": dead.String()}})
	return &Scenario{
		Replicas: cluster, Requests: reqs, Warmup: win.warmup, Horizon: win.horizon, SLO: 2 * time.Second,
		Heartbeat: hb, Seed: o.seed(hashName("cascade"), i),
		NewPicker: func(r int) Picker {
			p := Picker(NewSwitchyard(snap, fmt.Sprintf("broker-%d", r)))
			if exclude {
				x := &ExcludeSaturated{Picker: p, Saturation: snap.Policy.SaturationKV}
				if rot != nil {
					x.Trace = rot.trace
				}
				p = x
			}
			return p
		},
	}
}

func indexOf[T comparable](s []T, v T) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// Collapse returns, for the given heartbeat, the load where excluding
// saturated replicas loses the most goodput relative to deprioritizing
// them, and both arms' points there.
func (r *CascadeResult) Collapse(hb time.Duration) (deprio, exclude CascadePoint) {
	h := indexOf(r.Heartbeats, hb)
	if h < 0 {
		return
	}
	best := -1.0
	for i := range r.Rates {
		d, e := r.Points[h][0][i], r.Points[h][1][i]
		// Only loads the deprioritizing policy still serves count: past
		// capacity every arm collapses.
		if d.Goodput < 0.8*d.Offered {
			continue
		}
		if loss := 1 - e.Goodput/d.Goodput; loss > best {
			best, deprio, exclude = loss, d, e
		}
	}
	return
}

// Section renders the comparison.
func (r *CascadeResult) Section() *Section {
	good := &Chart{File: "cascade-goodput.png", Title: "Goodput vs offered load: deprioritize vs exclude saturated replicas",
		XLabel: "offered load (requests/s)", YLabel: "goodput (requests/s with TTFT ≤ 2 s)"}
	tail := &Chart{File: "cascade-p99-ttft.png", Title: "p99 TTFT of served requests vs offered load",
		XLabel: "offered load (requests/s)", YLabel: "p99 TTFT (ms, log scale)", LogY: true}
	fail := &Chart{File: "cascade-rejected.png", Title: "Rejected requests vs offered load",
		XLabel: "offered load (requests/s)", YLabel: "rejected (% of offered)"}
	var rows [][]string
	var md [][]string
	for h, hb := range r.Heartbeats {
		for arm, name := range []string{"deprioritize", "exclude"} {
			label := fmt.Sprintf("%s (load view every %s)", name, hb)
			var x, g, p, f []float64
			for _, pt := range r.Points[h][arm] {
				x = append(x, pt.Offered)
				g = append(g, pt.Goodput)
				p = append(p, pt.P99)
				f = append(f, 100*pt.FailShare())
				rows = append(rows, []string{name, fmt.Sprint(hb.Seconds()), f2(pt.Rate), f2(pt.Offered), f2(pt.Goodput), ms(pt.P50), ms(pt.P99), f3(pt.FailShare()), fmt.Sprint(pt.Failures["no_replicas"]), fmt.Sprint(pt.Failures["all_replicas_busy"])})
				md = append(md, []string{name, hb.String(), f1(pt.Offered), f2(pt.Goodput), ms(pt.P99), pct(pt.FailShare())})
			}
			good.Series = append(good.Series, Series{Name: label, X: x, Y: g})
			tail.Series = append(tail.Series, Series{Name: label, X: x, Y: p})
			fail.Series = append(fail.Series, Series{Name: label, X: x, Y: f})
		}
	}
	charts := []*Chart{good, tail, fail}
	var timeline string
	if r.Rotation != nil && len(r.Rotation.t) > 0 {
		tl := r.rotationChart()
		charts = append(charts, tl)
		timeline = img(tl)
	}
	var find strings.Builder
	var head []string
	for _, hb := range r.Heartbeats {
		d, e := r.Collapse(hb)
		if d.N == 0 {
			continue
		}
		loss := 1 - e.Goodput/d.Goodput
		fmt.Fprintf(&find, "- Load view every %s: the worst load for excluding, among those where deprioritizing still serves "+
			"≥ 80%% of the offered load within the SLO, is %.1f req/s: deprioritizing serves %.2f req/s within the SLO "+
			"(%s rejected, p99 TTFT %s ms), excluding %.2f req/s (%s rejected, p99 TTFT %s ms): **%.0f%% of the goodput lost**.\n",
			hb, d.Offered, d.Goodput, pct(d.FailShare()), ms(d.P99), e.Goodput, pct(e.FailShare()), ms(e.P99), 100*loss)
		head = append(head, fmt.Sprintf("%.0f%% with a %s load view", 100*loss, hb))
	}
	var rot string
	if r.Rotation != nil && len(r.Rotation.t) > 0 {
		end := r.Rotation.t[len(r.Rotation.t)-1]
		rot = fmt.Sprintf(" In the run charted above, the exclude arm kept %.1f of 4 replicas in rotation on average, and none %s of the time.",
			r.Rotation.mean(30, end), pct(r.Rotation.zeroShare(30, end)))
	}
	text := fmt.Sprintf(`**Question.** A saturated replica (kv_usage ≥ `+"`saturation_kv`"+` 0.95, or a full queue) can be
excluded from the candidates or only deprioritized (the policy adds a penalty of 1.0 to its
load_score). Does excluding cascade?

**Setup.** 4 replicas whose KV cache binds (2048 blocks, `+"`max_queue`"+` 16): single requests with
2000-token prompts and 40-token answers, so a replica's load changes within a second or two.
*Deprioritize* is the policy as it is. *Exclude* wraps the same policy and, before a heartbeat
reaches it, marks a saturated replica's state `+"`draining`"+`: the policy then drops it from the
candidates until a heartbeat reports it unsaturated (no change to the policy's code). Each arm runs
with heartbeats every second and with a load view refreshed every 5 s (metrics scraped every 5 s;
`+"`stale_after`"+` raised to 11 s so the guard does not fire between refreshes). Goodput counts first
tokens within 2 s. Both arms see the same requests and draw the same random numbers.

%s%s%s%s
%s
**Findings.**

%s
Excluding concentrates the load on the replicas still in rotation, which saturate in turn.%s A
replica stays out until a load report shows it unsaturated, so with a 5 s view it also stays out
for up to 5 s after it has drained, while the others take its share. With 1 s heartbeats the
damage before capacity is small: the policy's fast load view readmits replicas quickly. Past
capacity (the right edge) both arms fail: deprioritizing fills every engine queue (TTFT beyond the
SLO, then `+"`all_replicas_busy`"+`) while excluding sheds load with 503s, which keeps the survivors'
TTFT lower; a request deadline (`+"`Llm-Deadline`"+`, not set here) is what lets the policy reject early.
`, img(good), img(tail), img(fail), timeline,
		mdTable([]string{"arm", "load view", "offered (req/s)", "goodput (req/s)", "p99 TTFT (ms)", "rejected"}, md), find.String(), rot)
	return &Section{
		Name: "cascade", Title: "2. Exclude vs deprioritize saturated replicas", Text: text, Charts: charts,
		Headline: "goodput lost by excluding saturated replicas instead of deprioritizing them: " + strings.Join(head, ", ") +
			" (at the worst load where deprioritizing still serves ≥ 80% within the SLO).",
		Tables: []*Table{{File: "cascade.csv", Header: []string{"arm", "heartbeat_s", "rate_rps", "offered_rps", "goodput_rps", "p50_ttft_ms", "p99_ttft_ms", "rejected_share", "no_replicas", "all_replicas_busy"}, Rows: rows}},
	}
}

// rotationChart shows the exclusion cascade as it happens: the replicas
// the exclude arm keeps in rotation, heartbeat by heartbeat.
func (r *CascadeResult) rotationChart() *Chart {
	rot := r.Rotation
	var x, y []float64
	for i := range rot.t {
		if rot.t[i] > 180 {
			break
		}
		if i > 0 { // a step: the count holds until the next heartbeat
			x, y = append(x, rot.t[i]), append(y, y[len(y)-1])
		}
		x, y = append(x, rot.t[i]), append(y, rot.n[i])
	}
	return &Chart{File: "cascade-rotation.png",
		Title:  fmt.Sprintf("Exclude arm: replicas in rotation at %.0f req/s (load view every %s)", r.TimelineRate, r.Heartbeats[len(r.Heartbeats)-1]),
		XLabel: "time (s)", YLabel: "replicas in rotation (of 4)", YMin: -0.2, YMax: 4.8, LegendRight: true,
		Series: []Series{{Name: "replicas not excluded", X: x, Y: y, NoMarks: true}}}
}
