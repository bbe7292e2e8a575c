package lab

import (
	"fmt"
	"strings"
	"time"

	"github.com/switchyard-llm/switchyard/table"
)

// PDArm is one way to serve the same GPUs: aggregated (every replica
// prefills and decodes) or split into prefill and decode replicas.
type PDArm struct {
	Name            string
	Prefill, Decode int // replicas of each role; Prefill 0: aggregated
	MinUncached     int // min_uncached_tokens; -1: disaggregation off
}

// PDPoint is one arm at one offered load.
type PDPoint struct {
	Rate float64
	// All, Short and Long summarize the time to first token of every
	// request, the chat requests and the long documents.
	All, Short, Long Summary
	// ITL50, ITL99 and ITL999 are the inter-token latency percentiles of
	// every request, ms.
	ITL50, ITL99, ITL999 float64
	// Split is the share of the measured requests that ran a prefill leg.
	Split float64
}

// PDResult is the comparison across a load ramp, and the sweep of
// min_uncached_tokens at one load.
type PDResult struct {
	GPUs  int
	Rates []float64
	Arms  []PDArm
	Ramp  [][]PDPoint // [arm][rate]
	// SweepRate is the load of the sweep; Sweep its points on the split
	// arm SweepArm, one per Thresholds entry (-1: disaggregation off).
	SweepRate  float64
	SweepArm   PDArm
	Thresholds []int
	Sweep      []PDPoint
	// Aggregated is the aggregated arm at SweepRate, for reference.
	Aggregated PDPoint
}

// pdWorkload is a mix of chat sessions (a shared system prompt, two turns
// on average) and long documents read once.
func pdWorkload(rate float64, d time.Duration) Workload {
	return Workload{
		Rate: rate, Duration: d,
		SystemPrompts: 8, SystemTokens: 1000, SystemZipf: 1.2, SystemShare: 0.7,
		Turns: 2, ThinkTime: 5 * time.Second,
		UserTokens: 300, OutputTokens: 150, SizeSigma: 0.6, Tenants: 4,
		LongShare: 0.15, LongTokens: 8000, LongOutput: 150,
	}
}

// pdThreshold is min_uncached_tokens of the ramp's split arms: above every
// chat turn of this workload, below every document.
const pdThreshold = 4096

// PD compares aggregated against disaggregated serving on the same four
// GPUs: 4 replicas that each prefill and decode, against 1 prefill and 3
// decode replicas and 2 and 2, with Switchyard's policy deciding each
// request's split (the broker's split check: uncached prompt tokens on
// the chosen decode replica against min_uncached_tokens, the prefill
// replica by prefix and load). The engines are enginesim's model: a
// prefill is compute-bound and, without chunked prefill, stalls every
// decode co-batched on its replica; a decode leg pulls the prompt's KV at
// KVTransferPerToken (a tenth of a prefilled token's cost) in its first
// step instead of computing it.
func PD(o Options) *PDResult {
	win := o.window(300*time.Second, 90*time.Second, 60*time.Second)
	reps := pick(o, 3, 2, 1)
	rates := pick(o, []float64{2, 3, 4, 5, 6, 7, 8, 9, 10}, []float64{2, 4, 6, 8, 10}, []float64{3, 7})
	arms := []PDArm{
		{Name: "aggregated 4", MinUncached: -1},
		{Name: "split 1P+3D", Prefill: 1, Decode: 3, MinUncached: pdThreshold},
		{Name: "split 2P+2D", Prefill: 2, Decode: 2, MinUncached: pdThreshold},
	}
	sweepArm := arms[1]
	thresholds := pick(o, []int{0, 512, 1024, 2048, 4096, 6144, 8192, -1}, []int{0, 1024, 2048, 4096, 8192, -1}, []int{0, 4096, -1})
	sweepRate := pick(o, 6.0, 6.0, 7.0)

	out := &PDResult{GPUs: 4, Rates: rates, Arms: arms, SweepRate: sweepRate, SweepArm: sweepArm, Thresholds: thresholds}
	allRates := append(append([]float64(nil), rates...), sweepRate)
	work := make([][][]*Request, len(allRates))
	for ri, rate := range allRates {
		work[ri] = o.workloads(fmt.Sprintf("pd-%g", rate), reps, func(int) Workload { return pdWorkload(rate, win.horizon) })
	}
	type cfg struct {
		arm  PDArm
		rate int // index in allRates
	}
	var cfgs []cfg
	for _, a := range arms {
		for ri := range rates {
			cfgs = append(cfgs, cfg{a, ri})
		}
	}
	for _, t := range thresholds {
		a := sweepArm
		a.MinUncached = t
		cfgs = append(cfgs, cfg{a, len(allRates) - 1})
	}
	cfgs = append(cfgs, cfg{arms[0], len(allRates) - 1})
	res := o.runGrid(len(cfgs), reps, func(i, k int) *Scenario {
		c := cfgs[i]
		cluster := pdCluster(c.arm, out.GPUs)
		snap := mustTable(cluster, pdModel(c.arm.MinUncached))
		return &Scenario{
			Replicas: cluster, Requests: work[c.rate][k], Warmup: win.warmup, Horizon: win.horizon, SLO: 2 * time.Second,
			Seed: o.seed(hashName("pd"), uint64(k)), ITL: true,
			NewPicker: func(r int) Picker { return NewSwitchyard(snap, fmt.Sprintf("broker-%d", r)) },
		}
	})
	point := func(i int) PDPoint {
		rs := res[i]
		p := PDPoint{Rate: allRates[cfgs[i].rate]}
		p.All = Pool(rs, nil)
		p.Short = Pool(rs, func(q *Request) bool { return !q.Long })
		p.Long = Pool(rs, func(q *Request) bool { return q.Long })
		p.ITL50, p.ITL99, p.ITL999 = ITL(rs, nil)
		var split, n int
		for _, r := range rs {
			for j, q := range r.Requests {
				if q.At < r.Warmup || q.At >= r.Horizon {
					continue
				}
				n++
				if r.Outcomes[j].Prefill >= 0 {
					split++
				}
			}
		}
		p.Split = ratio(float64(split), float64(n))
		return p
	}
	i := 0
	for range arms {
		var pts []PDPoint
		for range rates {
			pts = append(pts, point(i))
			i++
		}
		out.Ramp = append(out.Ramp, pts)
	}
	for range thresholds {
		out.Sweep = append(out.Sweep, point(i))
		i++
	}
	out.Aggregated = point(i)
	return out
}

// pdCluster is the arm's replicas on gpus GPUs: prefill replicas first.
func pdCluster(a PDArm, gpus int) []Replica {
	eng := Profile()
	if a.Prefill == 0 {
		return replicas("r", "general", gpus, eng)
	}
	out := replicas("p", "general", a.Prefill, eng)
	for i := range out {
		out[i].Role = table.RolePrefill
	}
	d := replicas("d", "general", a.Decode, eng)
	for i := range d {
		d[i].Role = table.RoleDecode
	}
	return append(out, d...)
}

// pdModel is the model key with disaggregation at min_uncached_tokens t
// (-1: off).
func pdModel(t int) map[string]any {
	m := map[string]any{"versions": []string{Version}, "tier": "hot", "max_context_tokens": 131072, "default_max_tokens": 1024}
	if t >= 0 {
		m["disaggregation"] = map[string]any{"enabled": true, "min_uncached_tokens": t}
	}
	return map[string]any{"models." + ModelID: m}
}

func thresholdName(t int) string {
	if t < 0 {
		return "off"
	}
	return fmt.Sprint(t)
}

// pdRow is a CSV row of one point.
func pdRow(arm string, t int, p PDPoint) []string {
	return []string{arm, f1(p.Rate), thresholdName(t), fmt.Sprint(p.All.N), f3(p.Split),
		ms(p.Short.P50), ms(p.Short.P99), ms(p.Long.P50), ms(p.Long.P99), ms(p.ITL50), ms(p.ITL99), ms(p.ITL999), f3(p.All.FailShare())}
}

func pdHeader() []string {
	return []string{"arm", "rate_rps", "min_uncached_tokens", "requests", "split_share",
		"short_p50_ttft_ms", "short_p99_ttft_ms", "long_p50_ttft_ms", "long_p99_ttft_ms", "p50_itl_ms", "p99_itl_ms", "p999_itl_ms", "failed_share"}
}

// Section renders the ramp and the sweep.
func (r *PDResult) Section() *Section {
	line := func(file, title, y string, f func(PDPoint) float64) *Chart {
		c := &Chart{File: file, Title: title, XLabel: "offered load (req/s)", YLabel: y, LogY: true}
		for ai, a := range r.Arms {
			var x, v []float64
			for _, p := range r.Ramp[ai] {
				x, v = append(x, p.Rate), append(v, f(p))
			}
			c.Series = append(c.Series, Series{Name: a.Name, X: x, Y: v})
		}
		return c
	}
	itl := line("pd-itl.png", "p99 and p99.9 inter-token latency across the load ramp", "inter-token latency (ms, log scale)", func(p PDPoint) float64 { return p.ITL99 })
	for ai := range itl.Series {
		itl.Series[ai].Name += ", p99"
		var v []float64
		for _, p := range r.Ramp[ai] {
			v = append(v, p.ITL999)
		}
		itl.Series = append(itl.Series, Series{Name: r.Arms[ai].Name + ", p99.9", X: itl.Series[ai].X, Y: v})
	}
	short := line("pd-ttft-short.png", "p99 TTFT of the chat requests across the load ramp", "p99 TTFT, chat requests (ms, log scale)", func(p PDPoint) float64 { return p.Short.P99 })
	long := line("pd-ttft-long.png", "p99 TTFT of the 8000-token documents across the load ramp", "p99 TTFT, documents (ms, log scale)", func(p PDPoint) float64 { return p.Long.P99 })
	cats := make([]string, len(r.Thresholds))
	var s99, l99, i99 []float64
	for i, t := range r.Thresholds {
		cats[i] = thresholdName(t)
		s99 = append(s99, r.Sweep[i].Short.P99)
		l99 = append(l99, r.Sweep[i].Long.P99)
		i99 = append(i99, r.Sweep[i].ITL999)
	}
	sweep := &Chart{File: "pd-threshold.png", Title: fmt.Sprintf("min_uncached_tokens on %s at %.0f req/s", r.SweepArm.Name, r.SweepRate),
		XLabel: "min_uncached_tokens", YLabel: "ms", Bars: true, Categories: cats,
		Series: []Series{{Name: "p99 TTFT, chat", Y: s99}, {Name: "p99 TTFT, documents", Y: l99}, {Name: "p99.9 inter-token latency", Y: i99}}}

	var rows, ramp, sw [][]string
	for ai, a := range r.Arms {
		for _, p := range r.Ramp[ai] {
			rows = append(rows, pdRow(a.Name, a.MinUncached, p))
			ramp = append(ramp, []string{a.Name, f1(p.Rate), pct(p.Split), ms(p.Short.P50), ms(p.Short.P99), ms(p.Long.P50), ms(p.Long.P99), ms(p.ITL50), ms(p.ITL99), ms(p.ITL999), pct(p.All.FailShare())})
		}
	}
	var swRows [][]string
	for i, t := range r.Thresholds {
		p := r.Sweep[i]
		swRows = append(swRows, pdRow(r.SweepArm.Name, t, p))
		sw = append(sw, []string{thresholdName(t), pct(p.Split), ms(p.Short.P50), ms(p.Short.P99), ms(p.Long.P50), ms(p.Long.P99), ms(p.ITL50), ms(p.ITL99), ms(p.ITL999), pct(p.All.FailShare())})
	}
	ag := r.Aggregated
	sw = append(sw, []string{"(aggregated 4)", pct(ag.Split), ms(ag.Short.P50), ms(ag.Short.P99), ms(ag.Long.P50), ms(ag.Long.P99), ms(ag.ITL50), ms(ag.ITL99), ms(ag.ITL999), pct(ag.All.FailShare())})
	swRows = append(swRows, pdRow(r.Arms[0].Name, -1, ag))

	head := []string{"arm", "req/s", "split", "chat p50 TTFT", "chat p99 TTFT", "doc p50 TTFT", "doc p99 TTFT", "p50 ITL", "p99 ITL", "p99.9 ITL", "failed"}
	text := fmt.Sprintf(`**Question.** Splitting a request's prefill from its decode onto other GPUs keeps long prompts
from stalling everyone's tokens, but it takes GPUs away from whole serving and adds a KV transfer.
On the same GPUs, where does it win and where does it lose, and where should `+"`min_uncached_tokens`"+` sit?

**Setup.** %d GPUs (one replica each) serve a mix: 85%% chat sessions (70%% open with one of 8
shared 1000-token system prompts, then 300-token messages, two turns on average) and 15%% documents
of 8000 tokens read once; 150 answer tokens. *Aggregated*: 4 replicas that prefill and decode.
*Split*: 1 prefill and 3 decode replicas, or 2 and 2, with disaggregation on at
`+"`min_uncached_tokens`"+` %d (above every chat turn, below every document). Switchyard's policy decides
every request, the split included (the broker's split check: the prompt less what the prefix
knowledge says the chosen decode replica holds, against the threshold; the prefill replica by
prefix and load). The engines are the lab's model: a prefill step costs 40 ms plus 80 µs per
uncached token and, without chunked prefill, every decode co-batched on its replica waits for it
(an 8000-token document stalls a replica's batch for 0.68 s); a decode step costs 25 ms plus 0.4 ms
per running request; a decode leg pulls the prompt's KV at 10 µs per token (a tenth of computing
it, a fast interconnect) in the step that admits it, plus that step's 40 ms. Inter-token latency is
every gap between two tokens of a request.

%s%s%s
%s
Sweep of `+"`min_uncached_tokens`"+` on %s at %.0f req/s:

%s
%s
**Finding.** %s
`, r.GPUs, pdThreshold, img(itl), img(short), img(long),
		mdTable(head, ramp), r.SweepArm.Name, r.SweepRate, img(sweep),
		mdTable([]string{"min_uncached_tokens", "split", "chat p50 TTFT", "chat p99 TTFT", "doc p50 TTFT", "doc p99 TTFT", "p50 ITL", "p99 ITL", "p99.9 ITL", "failed"}, sw),
		r.finding())
	return &Section{
		Name: "pd", Title: "9. Prefill and decode on different replicas", Text: text,
		Headline: r.headline(),
		Charts:   []*Chart{itl, short, long, sweep},
		Tables: []*Table{
			{File: "pd.csv", Header: pdHeader(), Rows: rows},
			{File: "pd-threshold.csv", Header: pdHeader(), Rows: swRows},
		},
	}
}

// finding and headline say, from the figures, where splitting wins and
// where it loses.
func (r *PDResult) finding() string {
	agg, one, two := r.Ramp[0], r.Ramp[1], r.Ramp[2]
	lo, hi := 0, len(r.Rates)-1
	var chatWins, tailWins, itlWorse, twoWorse []string
	for k := range r.Rates {
		if one[k].Short.P99 < agg[k].Short.P99 {
			chatWins = append(chatWins, f1(r.Rates[k]))
		}
		if one[k].ITL999 < agg[k].ITL999 {
			tailWins = append(tailWins, f1(r.Rates[k]))
		}
		if one[k].ITL99 > agg[k].ITL99 {
			itlWorse = append(itlWorse, f1(r.Rates[k]))
		}
		if two[k].Short.P99 > agg[k].Short.P99 {
			twoWorse = append(twoWorse, f1(r.Rates[k]))
		}
	}
	mid := len(r.Rates) / 2
	sw := func(t int) PDPoint {
		for i, v := range r.Thresholds {
			if v == t {
				return r.Sweep[i]
			}
		}
		return PDPoint{}
	}
	all, off, at := sw(0), sw(-1), sw(pdThreshold)
	var b strings.Builder
	fmt.Fprintf(&b, `**Where splitting wins: the chat requests' first token and the rare long stall.** With the
documents prefilled on the prefill replica, a chat turn no longer waits behind an 8000-token prefill
on its replica: on %s the chat requests' p99 TTFT is lower than aggregated at %s req/s (%s → %s ms at
%.0f req/s, %s → %s ms at %.0f req/s). The 0.68 s stalls leave the decode replicas, so the p99.9
inter-token latency is lower at %s req/s (%s → %s ms at %.0f req/s).

**Where it loses.** The documents pay for it: each split one waits for its prefill leg, then for the
KV pull and a step on the decode replica (p50 TTFT %s → %s ms at %.0f req/s), and with one prefill
replica they queue behind each other instead of spreading over four (p99 %s → %s ms at %.0f req/s).
The p99 inter-token latency is not better, and higher at %s req/s (%s → %s ms at %.0f req/s): the
decode replicas still prefill every chat turn, three replicas now instead of four, and every
decode leg charges its KV pull to the step that admits it, so 100–150 ms stalls come more often
than the 0.68 s ones they replace. And a split fixes the ratio of the GPUs: %s has half of them
decoding and its chat p99 TTFT is above aggregated at %s req/s (%s ms at %.0f req/s); even %s runs
out of room at %.0f req/s (chat p99 %s ms against %s aggregated).

**The threshold.** At 0 every prompt takes the one prefill replica: the best inter-token tail
(p99.9 %s ms) but chat p99 TTFT %s ms. %d splits only the documents (chat p99 %s ms, p99.9 ITL %s
ms); a threshold in the range of the chat turns also splits the longest of them onto the busy
prefill replica. Past the documents' size (and with disaggregation off) nothing is split and the
prefill replica idles: the three decode replicas serve everything, worse than four aggregated
(chat p99 %s ms against %s).

So on this model of the engines, splitting pays where the chat tail and the inter-token tail
matter and the long prompts are few enough for a prefill pool sized to them, with
`+"`min_uncached_tokens`"+` between the chat turns and the documents; a split that leaves decode
replicas short, or a prefill pool that idles, is worse than serving whole. The model leans against
splitting in one respect: the KV pull is charged inside the decode replica's step (vLLM's NIXL
connector pulls asynchronously, so real decode replicas stall less), and for it in another: the
transfer never queues on the network.`,
		r.Arms[1].Name, orNone(chatWins), ms(agg[lo].Short.P99), ms(one[lo].Short.P99), r.Rates[lo],
		ms(agg[hi-1].Short.P99), ms(one[hi-1].Short.P99), r.Rates[hi-1],
		orNone(tailWins), ms(agg[mid].ITL999), ms(one[mid].ITL999), r.Rates[mid],
		ms(agg[lo].Long.P50), ms(one[lo].Long.P50), r.Rates[lo], ms(agg[mid].Long.P99), ms(one[mid].Long.P99), r.Rates[mid],
		orNone(itlWorse), ms(agg[mid].ITL99), ms(one[mid].ITL99), r.Rates[mid],
		r.Arms[2].Name, orNone(twoWorse), ms(two[hi].Short.P99), r.Rates[hi], r.Arms[1].Name, r.Rates[hi], ms(one[hi].Short.P99), ms(agg[hi].Short.P99),
		ms(all.ITL999), ms(all.Short.P99), pdThreshold, ms(at.Short.P99), ms(at.ITL999), ms(off.Short.P99), ms(r.Aggregated.Short.P99))
	return b.String()
}

func orNone(v []string) string {
	if len(v) == 0 {
		return "no load of the ramp"
	}
	return strings.Join(v, ", ")
}

func (r *PDResult) headline() string {
	agg, one := r.Ramp[0], r.Ramp[1]
	mid := len(r.Rates) / 2
	return fmt.Sprintf("on the same 4 GPUs at %.0f req/s, %s cuts the chat requests' p99 TTFT %s → %s ms and the p99.9 inter-token latency %s → %s ms; "+
		"the documents it splits pay (p99 TTFT %s → %s ms), the p99 inter-token latency goes %s → %s ms, and a split short of decode replicas is worse than serving whole.",
		r.Rates[mid], r.Arms[1].Name, ms(agg[mid].Short.P99), ms(one[mid].Short.P99), ms(agg[mid].ITL999), ms(one[mid].ITL999),
		ms(agg[mid].Long.P99), ms(one[mid].Long.P99), ms(agg[mid].ITL99), ms(one[mid].ITL99))
}
