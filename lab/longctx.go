package lab

import (
	"fmt"
	"time"
)

// LongCtxResult compares a pool that mixes 64k-token requests with the rest
// against one that sends them to a long-context pool of their own.
type LongCtxResult struct {
	Rate float64
	// Short and Long summarize the two classes, [0] mixed, [1] segregated.
	Short, Long [2]Summary
}

// Improvement is how many times lower the short requests' p99 TTFT is with
// segregation.
func (r *LongCtxResult) Improvement() float64 { return r.Short[0].P99 / r.Short[1].P99 }

// LongCtx offers 2% of requests at 64 000 prompt tokens to 4 replicas (KV
// 8192 blocks each, 131 072 tokens). Mixed: all 4 in the general pool and
// no pool rule. Segregated: 3 general replicas and 1 in the long-context
// pool, with the design's rule (prompt > long_context_tokens 16000 →
// long-context). Same hardware, same requests.
func LongCtx(o Options) *LongCtxResult {
	win := o.window(600*time.Second, 300*time.Second, 200*time.Second)
	reps := pick(o, 3, 2, 1)
	w := Workload{
		Rate: 5, Duration: win.horizon, UserTokens: 1000, OutputTokens: 200, SizeSigma: 0.6, Tenants: 4,
		LongShare: 0.02, LongTokens: 64000, LongOutput: 200,
	}
	work := o.workloads("longctx", reps, func(int) Workload { return w })
	eng := Profile()
	eng.KVBlocks = 8192
	mixed := replicas("r", "general", 4, eng)
	seg := append(replicas("r", "general", 3, eng), Replica{ID: "long-0", Pool: "long-context", Engine: eng})
	res := o.runGrid(2, reps, func(i, k int) *Scenario {
		cluster, extra := mixed, map[string]any{"policy": map[string]any{"pool_rules": []any{}}}
		if i == 1 {
			cluster, extra = seg, nil
		}
		snap := mustTable(cluster, extra)
		return &Scenario{
			Replicas: cluster, Requests: work[k], Warmup: win.warmup, Horizon: win.horizon, SLO: 2 * time.Second,
			Seed:      o.seed(hashName("longctx"), uint64(k)),
			NewPicker: func(r int) Picker { return NewSwitchyard(snap, fmt.Sprintf("broker-%d", r)) },
		}
	})
	out := &LongCtxResult{Rate: w.Rate}
	for i := range 2 {
		out.Short[i] = Pool(res[i], func(q *Request) bool { return !q.Long })
		out.Long[i] = Pool(res[i], func(q *Request) bool { return q.Long })
	}
	return out
}

// Section renders the comparison.
func (r *LongCtxResult) Section() *Section {
	arms := []string{"mixed pool", "long-context pool"}
	ttft := &Chart{File: "longctx-ttft.png", Title: "TTFT of the 98% short requests, with and without segregation",
		XLabel: "", YLabel: "TTFT of short requests (ms)", Bars: true, Categories: arms,
		Series: []Series{
			{Name: "p50", Y: []float64{r.Short[0].P50, r.Short[1].P50}},
			{Name: "p90", Y: []float64{r.Short[0].P90, r.Short[1].P90}},
			{Name: "p99", Y: []float64{r.Short[0].P99, r.Short[1].P99}},
		}}
	var rows, md [][]string
	for i, a := range arms {
		for _, c := range []struct {
			name string
			s    Summary
		}{{"short", r.Short[i]}, {"long", r.Long[i]}} {
			rows = append(rows, []string{a, c.name, fmt.Sprint(c.s.N), ms(c.s.P50), ms(c.s.P90), ms(c.s.P99), f3(c.s.FailShare())})
			md = append(md, []string{a, c.name, fmt.Sprint(c.s.N), ms(c.s.P50), ms(c.s.P90), ms(c.s.P99)})
		}
	}
	text := fmt.Sprintf(`**Question.** With 2%% of requests at 64k tokens, how much does segregating them into a
long-context pool protect the p99 TTFT of the other 98%%?

**Setup.** 4 replicas with 8192 KV blocks each (131 072 tokens), %.1f req/s: 98%% single requests
of about 1000 prompt tokens, 2%% of 64 000 tokens (a document each, uncached), 200 answer tokens.
*Mixed*: all 4 replicas in the general pool, no pool rule. *Segregated*: 3 general replicas and 1
in the long-context pool, with the design's rule (prompt > `+"`long_context_tokens`"+` 16000 →
long-context). Same hardware, same requests, Switchyard's policy in both.

%s
%s
**Finding.** Segregation cuts the short requests' p99 TTFT from %s ms to %s ms, **%.1f× lower**
(p50 %s → %s ms). In the mixed pool a 64k prompt's prefill takes about 5 s, and since this engine
does not chunk prefill the whole batch of its replica stalls behind it; it also holds half the
replica's KV, so short requests queue behind it. The long requests pay for the isolation: with
one replica for all of them their p99 TTFT goes from %s to %s ms — the pool has to be sized for
them.
`, r.Rate, img(ttft), mdTable([]string{"arm", "class", "requests", "p50 TTFT (ms)", "p90 TTFT (ms)", "p99 TTFT (ms)"}, md),
		ms(r.Short[0].P99), ms(r.Short[1].P99), r.Improvement(), ms(r.Short[0].P50), ms(r.Short[1].P50),
		ms(r.Long[0].P99), ms(r.Long[1].P99))
	return &Section{
		Name: "longctx", Title: "4. Long-context segregation", Text: text, Charts: []*Chart{ttft},
		Headline: fmt.Sprintf("segregating the 2%% of 64k-token requests cuts the other requests' p99 TTFT %.1f× (%s → %s ms); the long ones wait longer (p99 %s → %s ms).",
			r.Improvement(), ms(r.Short[0].P99), ms(r.Short[1].P99), ms(r.Long[0].P99), ms(r.Long[1].P99)),
		Tables: []*Table{{File: "longctx.csv", Header: []string{"arm", "class", "requests", "p50_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "failed_share"}, Rows: rows}},
	}
}
