package lab

import (
	"fmt"
	"strings"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// Objectives arms.
const (
	ObjToday     = "Switchyard power-of-two (today)"
	ObjPredicted = "Switchyard predicted-TTFT + objective"
)

// ObjectiveStep is one arm at one step of the ramp: the shares of the
// requests that arrived during it which got their first token within the
// objective, which were refused for it, and which failed otherwise (an
// engine's full queue, no first token before the run ended).
type ObjectiveStep struct {
	Rate                 float64
	N                    int
	Met, Refused, Failed float64
	// P50 and P99 are the TTFT of the requests served, ms.
	P50, P99 float64
}

// ObjectivesResult compares the share of requests that meet a TTFT
// objective across a load ramp.
type ObjectivesResult struct {
	Rates     []float64
	Stage     time.Duration
	Objective time.Duration
	Arms      []string
	Steps     [][]ObjectiveStep // by arm, then step
	// Knee is the last step at which today's policy meets the objective
	// for at least kneeShare of the requests (-1: none).
	Knee int
}

// kneeShare is the share of requests meeting the objective that marks
// the knee of the ramp.
const kneeShare = 0.9

// Objectives runs a rising ramp of single requests of varied prompt
// lengths over 4 replicas, through today's policy (power of two, heartbeats
// only) and through predicted TTFT with a 1-second objective and load
// deltas between heartbeats. A request refused for its objective counts as
// a miss: refusing is not free, it has to buy the others their first token
// in time.
func Objectives(o Options) *ObjectivesResult {
	const objective = time.Second
	stage := pick(o, 60*time.Second, 20*time.Second, 15*time.Second)
	rates := pick(o, []float64{4, 8, 10, 12, 14, 16, 20, 24}, []float64{4, 8, 12, 14, 16, 20, 24}, []float64{6, 24})
	cluster := replicas("r", "general", 4, Profile())
	today := mustTable(cluster, nil)
	predicted := mustTable(cluster, map[string]any{
		table.KeyPolicy: map[string]any{"replica_choice": table.ChoicePredictedTTFT},
		"models." + ModelID: map[string]any{"versions": []string{Version}, "tier": "hot", "max_context_tokens": 131072,
			"default_max_tokens": 1024, "ttft_objective": objective.String()},
	})
	// A first stage at the lowest rate warms the replicas' estimates and
	// is not reported.
	ramp := append([]float64{rates[0]}, rates...)
	horizon := stage * time.Duration(len(ramp))
	w := Workload{Ramp: ramp, Duration: horizon, UserTokens: 1500, OutputTokens: 150, SizeSigma: 0.8}
	work := o.workloads("objectives", 1, func(int) Workload { return w })[0]
	arms := []string{ObjToday, ObjPredicted}
	res := o.runGrid(len(arms), 1, func(i, _ int) *Scenario {
		snap, deltas := today, false
		if arms[i] == ObjPredicted {
			snap, deltas = predicted, true
		}
		return &Scenario{
			Replicas: cluster, Requests: work, Warmup: stage, Horizon: horizon, SLO: objective,
			Drain: 120 * time.Second, Deltas: deltas, Seed: o.seed(hashName("objectives")),
			NewPicker: func(r int) Picker { return NewSwitchyard(snap, fmt.Sprintf("broker-%d", r)) },
		}
	})
	out := &ObjectivesResult{Rates: rates, Stage: stage, Objective: objective, Arms: arms, Knee: -1}
	for i := range arms {
		var steps []ObjectiveStep
		for k, rate := range rates {
			from, to := stage*time.Duration(k+1), stage*time.Duration(k+2)
			steps = append(steps, objectiveStep(res[i][0], rate, objective, from, to))
		}
		out.Steps = append(out.Steps, steps)
	}
	for k, s := range out.Steps[0] {
		if s.Met >= kneeShare {
			out.Knee = k
		}
	}
	return out
}

// objectiveStep summarizes the requests of r that arrived in [from, to).
func objectiveStep(r *Result, rate float64, objective, from, to time.Duration) ObjectiveStep {
	in := func(q *Request) bool { return q.At >= from && q.At < to }
	sum := Pool([]*Result{r}, in)
	s := ObjectiveStep{Rate: rate, N: sum.N, P50: sum.P50, P99: sum.P99}
	var met, refused, failed int
	for i, q := range r.Requests {
		if !in(q) {
			continue
		}
		switch o := &r.Outcomes[i]; {
		case o.Failed == subjects.CodeTTFTObjectiveUnreachable:
			refused++
		case o.Failed != "":
			failed++
		case o.TTFT <= objective:
			met++
		}
	}
	n := float64(max(sum.N, 1))
	s.Met, s.Refused, s.Failed = float64(met)/n, float64(refused)/n, float64(failed)/n
	return s
}

// Of returns the named arm's steps.
func (r *ObjectivesResult) Of(arm string) []ObjectiveStep {
	for i, a := range r.Arms {
		if a == arm {
			return r.Steps[i]
		}
	}
	return nil
}

func (r *ObjectivesResult) headline() string {
	top := len(r.Rates) - 1
	t, p := r.Of(ObjToday)[top], r.Of(ObjPredicted)[top]
	return fmt.Sprintf("at %.0f req/s, %s of requests get their first token within %v with predicted TTFT and the objective "+
		"(%s refused), against %s with today's power of two.", r.Rates[top], pct(p.Met), r.Objective, pct(p.Refused), pct(t.Met))
}

// Section renders the comparison.
func (r *ObjectivesResult) Section() *Section {
	met := &Chart{File: "objectives-met.png", Title: fmt.Sprintf("Requests meeting a %v TTFT objective over the ramp", r.Objective),
		XLabel: "offered load (req/s)", YLabel: "met the objective (% of requests; refused = missed)", YMin: 0, YMax: 100, LegendBottom: true}
	p99 := &Chart{File: "objectives-p99-ttft.png", Title: "p99 TTFT of the requests served over the ramp",
		XLabel: "offered load (req/s)", YLabel: "p99 TTFT (ms, log scale)", LogY: true}
	var rows, md [][]string
	for i, a := range r.Arms {
		var x, ym, yp []float64
		for _, s := range r.Steps[i] {
			x = append(x, s.Rate)
			ym = append(ym, 100*s.Met)
			yp = append(yp, s.P99)
			rows = append(rows, []string{a, f1(s.Rate), fmt.Sprint(s.N), f3(s.Met), f3(s.Refused), f3(s.Failed), ms(s.P50), ms(s.P99)})
		}
		met.Series = append(met.Series, Series{Name: a, X: x, Y: ym})
		p99.Series = append(p99.Series, Series{Name: a, X: x, Y: yp})
	}
	today, pred := r.Of(ObjToday), r.Of(ObjPredicted)
	for k := range r.Rates {
		t, p := today[k], pred[k]
		md = append(md, []string{f1(t.Rate), pct(t.Met), pct(p.Met), fmt.Sprintf("%+.1f", 100*(p.Met-t.Met)), pct(p.Refused),
			ms(t.P99), ms(p.P99)})
	}
	var find strings.Builder
	knee := "today's policy never meets the objective for 90% of the requests"
	if r.Knee >= 0 {
		knee = fmt.Sprintf("the knee is %.0f req/s, the last step where today's policy meets the objective for %.0f%% of the requests", r.Rates[r.Knee], 100*kneeShare)
	}
	fmt.Fprintf(&find, "- %s.\n", strings.ToUpper(knee[:1])+knee[1:])
	worst, least := 0.0, 1.0
	for k := range r.Rates {
		d := pred[k].Met - today[k].Met
		worst = min(worst, d)
		if k > r.Knee {
			least = min(least, d)
		}
	}
	fmt.Fprintf(&find, "- At no step does predicted TTFT meet the objective less often than today's policy (the least difference: %+.1f points).\n", 100*worst)
	if r.Knee < len(r.Rates)-1 {
		fmt.Fprintf(&find, "- Above the knee it meets it at least %.1f points more often.\n", 100*least)
	}
	text := fmt.Sprintf(`**Question.** With a TTFT objective of %v on every request, how many requests get their first
token in time as the load rises, when the policy chooses by predicted TTFT and refuses what it
predicts cannot meet the objective, against today's power of two? A refused request counts as a
miss: refusing pays only if it gets the others their first token in time.

**Setup.** 4 replicas (the lab profile), single requests of about 1500 prompt tokens (log-normal,
σ 0.8: from a few hundred to several thousand) and 150 answer tokens, one run whose rate rises
every %s (a first, unreported step warms the estimates). Today's policy sees the 1-second
heartbeats and its own in-flight count. The predicted-TTFT arm runs `+"`replica_choice: predicted-ttft`"+`
with the model's `+"`ttft_objective: %v`"+`, and hears the replicas' load deltas between heartbeats (at
most one per replica every 50 ms); its replicas' heartbeats carry the prefill rate and queued
prefill tokens their adapters learn.

%s%s
%s
**Findings.**

%s
**What it took.** The first run missed both musts: predicted TTFT met the objective less often
than power of two from the knee up (−14 points at 12 req/s), and refused too few requests above
it. Its predictions were a third of the first tokens that followed. The prefill queue was not
what the requests waited for: with the batch full, a request waits for a running one to finish,
which no prefill rate tells. A replica whose batch is full (after its load delta) is now predicted
at no less than its recent wait, the larger of its TTFT and queue-wait averages
(broker/policy, `+"`predict`"+`); between two candidates the predicted-ttft step prefers one with
room in its batch; and the load deltas keep the queue it is predicted on tens of milliseconds
old.
`, r.Objective, r.Stage, r.Objective, img(met), img(p99),
		mdTable([]string{"offered (req/s)", "met, today", "met, predicted-TTFT", "difference (points)", "refused, predicted-TTFT", "p99 TTFT today (ms)", "p99 TTFT predicted (ms)"}, md),
		find.String())
	return &Section{
		Name: "objectives", Title: "11. TTFT objectives over a load ramp", Text: text, Charts: []*Chart{met, p99},
		Headline: r.headline(),
		Tables: []*Table{{File: "objectives.csv", Header: []string{"arm", "offered_rps", "requests", "met_share", "refused_share",
			"failed_share", "p50_ttft_ms", "p99_ttft_ms"}, Rows: rows}},
	}
}
