package policy

import (
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
)

// RetryObjectiveMin is the least Retry-After of a request refused for its
// TTFT objective: the predictions change with every heartbeat.
const RetryObjectiveMin = time.Second

// objective is the TTFT objective in force for the decision: the
// request's, else its tenant's (tenants.<t>.ttft_objective), else the
// model's (models.<m>.ttft_objective); 0 when none is set.
func (st *decision) objective() time.Duration {
	if o := st.req.TTFTObjective; o > 0 {
		return o
	}
	if t := st.res.tenant; t != nil && t.TTFTObjective > 0 {
		return time.Duration(t.TTFTObjective)
	}
	if m := st.snap.Models[st.res.target.Model]; m != nil {
		return time.Duration(m.TTFTObjective)
	}
	return 0
}

// objectiveCheck is the TTFT objective check's state: the candidate it
// switched away from, -1 when none.
type objectiveCheck struct{ loser int }

// objective keeps the chosen replica when its predicted time to first
// token meets the objective; else it switches to the candidate with the
// lowest prediction if that one meets it. When none does, an interactive
// request is refused at once (503 ttft_objective_unreachable, Retry-After
// the time the fastest prediction is over the objective: the drain it
// waits for) rather than admitted to a queue that will miss it, and batch
// work goes to the fastest candidate anyway. A continuation was admitted
// once and is never refused here. The deadline check runs first: a request
// that can meet neither is refused for its deadline.
//
// Only replicas whose engines have given TTFT evidence (a first token
// timed, streamed or from the engine's own histogram) have a base TTFT of
// their own. A replica without evidence (one just scaled out) is judged as
// the lowest base TTFT among the candidates that have one, on top of its
// own queue: an idle newcomer is as fast as the fastest unloaded replica
// of its group, not as slow as the loaded ones, and not 0 ms. When no
// candidate has evidence, nothing is judged (the decision says there is no
// TTFT evidence yet).
func (p *pick) objective() (switched bool, e *subjects.APIError) {
	p.obj.loser = -1
	o := p.ttftObjective
	if o == 0 || p.req.ResumeFrom != "" {
		return false, nil
	}
	base, ok := p.lowestBase()
	if !ok {
		return false, nil
	}
	if p.judged(p.chosen, base) <= o {
		return false, nil
	}
	best := p.chosen
	for i := range p.cands {
		if p.judged(i, base) < p.judged(best, base) {
			best = i
		}
	}
	ttft := p.judged(best, base)
	if ttft <= o || p.req.Priority == subjects.PriorityBatch {
		if best == p.chosen {
			return false, nil
		}
		p.obj.loser, p.chosen = p.chosen, best
		return true, nil
	}
	e = subjects.NewError(503, subjects.CodeTTFTObjectiveUnreachable, "The lowest predicted time to first token, "+
		ttft.Round(time.Millisecond).String()+", misses the TTFT objective of "+o.String()+".")
	e.RetryAfter = max(ttft-o, RetryObjectiveMin)
	return false, e
}

// lowestBase is the lowest base TTFT (ms) among the candidates whose
// engines have given TTFT evidence; ok is false when none has.
func (p *pick) lowestBase() (base float64, ok bool) {
	for i := range p.cands {
		if x := p.cands[i].x; x.ttftKnown() && (!ok || x.baseTTFT < base) {
			base, ok = x.baseTTFT, true
		}
	}
	return base, ok
}

// judged is candidate i's predicted TTFT as the objective judges it: its
// own, or, without evidence of its own, base (lowestBase) on top of its
// queue.
func (p *pick) judged(i int, base float64) time.Duration {
	c := &p.cands[i]
	if c.x.ttftKnown() {
		return millis(c.ttft)
	}
	return millis(c.ttft + base)
}

// fastest is the candidate with the lowest predicted TTFT, the chosen one
// on a tie.
func (p *pick) fastest() int {
	best := p.chosen
	for i := range p.cands {
		if p.cands[i].ttft < p.cands[best].ttft {
			best = i
		}
	}
	return best
}

func (p *pick) whyObjective(i int) string {
	if i == p.obj.loser {
		return WhyObjective
	}
	return ""
}
