package policy

import (
	"strings"

	"github.com/switchyard-llm/switchyard/subjects"
)

// The replica choice is three tables of rows, each row a name, a method
// and what it reports, walked by the pick: filters make the candidates,
// steps choose one of them, checks may revise the choice. Adding a filter,
// a step or a check touches its row, its method (with its own state in
// pick) and its line in README.md; the walks, the reasons and the losers'
// explanations take it from the row.

// step declares one replica-choice step. The pick walks the steps in order
// and the first whose pick returns true decides; the last always does.
type step struct {
	// reason is Decision.Reason when the step decides, and its name.
	reason string
	// pick chooses p.chosen and returns true, or passes to the next step.
	pick func(p *pick) bool
	// why says why candidate i lost when this step decided; "" leaves it
	// to the load comparison (saturated, or a higher load_score).
	why func(p *pick, i int) string
	// report writes what the step found into the Decision, when its
	// choice stands (no check switched it); nil reports nothing.
	report func(p *pick, d *Decision)

	// reasons is the step's reason after every combination of route
	// modifiers and switching checks (see modifiers), joined once here so
	// the hot path does not allocate.
	reasons []string
}

// steps is the replica choice, in order. It is never written after
// initialisation.
//
// Each affinity step keeps its replica only while its kv_usage is below
// the pool's release threshold: the valve that stops one popular
// conversation, adapter or prefix from overloading a replica. Prefix
// affinity also weighs the warm replica it takes, above the threshold or
// not, against the power-of-two pair (see prefix).
var steps = [...]step{
	newStep(ReasonResponse, (*pick).pinned, nil, nil),
	newStep(ReasonSession, (*pick).session, (*pick).whySession, nil),
	newStep(ReasonLora, (*pick).lora, (*pick).whyLora, nil),
	newStep(ReasonPrefix, (*pick).prefix, (*pick).whyPrefix, (*pick).reportPrefix),
	newStep(ReasonPredicted, (*pick).predicted, (*pick).whyPredicted, (*pick).reportPredicted),
	newStep(ReasonOnly, (*pick).only, nil, nil),
	newStep(ReasonStaleRandom, (*pick).staleRandom, (*pick).whyStaleRandom, nil),
	newStep(ReasonPowerOfTwo, (*pick).powerOfTwo, (*pick).whyPowerOfTwo, nil),
	// The peers' (peers.go).
	newStep(ReasonLowestScore, (*pick).lowestScore, nil, (*pick).reportPeer),
	newStep(ReasonTTFTGate, (*pick).ttftGate, nil, (*pick).reportPeer),
	newStep(ReasonStickyPrefix, (*pick).stickyPrefix, (*pick).whySticky, (*pick).reportPeer),
	newStep(ReasonImbalanced, (*pick).imbalanced, nil, (*pick).reportPeer),
	newStep(ReasonCacheMatch, (*pick).cacheMatch, (*pick).whyCacheMatch, (*pick).reportPeer),
	newStep(ReasonShortestQueue, (*pick).shortestQueue, nil, (*pick).reportPeer),
}

// check declares one check of the chosen replica. Every check runs, in
// order, once a step has chosen: it keeps the replica, switches to another
// (its reason is then joined after the step's), or refuses the request.
type check struct {
	reason string
	// check returns whether it switched p.chosen, or the refusal.
	check func(p *pick) (switched bool, e *subjects.APIError)
	// why says why candidate i lost because of this check, "" when it
	// did not; it takes precedence over the step's why.
	why func(p *pick, i int) string
	// report writes what the check found into the Decision; nil reports
	// nothing.
	report func(p *pick, d *Decision)
}

// checks run after the step that chose, in order.
var checks = [...]check{
	{reason: ReasonDeadline, check: (*pick).deadline, why: (*pick).whyDeadline},
	{reason: ReasonObjective, check: (*pick).objective, why: (*pick).whyObjective},
	{reason: ReasonFairShare, check: (*pick).fairShare, why: (*pick).whyFair, report: (*pick).reportFair},
	{reason: ReasonBatchRoom, check: (*pick).batchRoom, why: (*pick).whyBatchRoom},
	{reason: ReasonSplit, check: (*pick).split, why: (*pick).whySplit, report: (*pick).reportSplit},
}

// filter declares one candidate filter. A group's candidates are its
// registered replicas that every filter in force keeps, filters in order.
type filter struct {
	name string
	// on says whether the filter is in force for the group list (nil:
	// always), preparing what keep needs.
	on func(p *pick, list []*replica) bool
	// keep reports whether replica x stays a candidate.
	keep func(p *pick, x *replica) bool
	// flags, when set, is keep as a test of the replica's flags: keep
	// holds exactly when x.flags&mask == want, and, with heard, x was
	// heard from within dead_after. The walk tests every such filter in
	// force with one mask per candidate, and calls keep, in order, only
	// for the replicas the mask leaves out (so a filter that counts what
	// it left out counts as if called) and for the filters without flags.
	flags func(p *pick) (mask, want uint16)
	heard bool
	// report writes what on found into the Decision; nil reports nothing.
	report func(p *pick, d *Decision)
}

// filters is the candidate filter, in order. A filter that counts what it
// left out (serves-endpoint) sees only replicas the ones before it kept.
var filters = [...]filter{
	{name: "live", keep: (*pick).live, flags: (*pick).liveFlags, heard: true},
	{name: "not-ejected", on: (*pick).ejectedOn, keep: (*pick).notEjected, report: (*pick).reportEjected},
	{name: "not-excluded", on: (*pick).excludeOn, keep: (*pick).notExcluded},
	{name: "pinned", on: (*pick).pinOn, keep: (*pick).pinnedTo},
	{name: "serves-endpoint", on: (*pick).endpointOn, keep: (*pick).servesEndpoint, flags: (*pick).endpointFlags},
	{name: "not-prefill", keep: (*pick).notPrefill, flags: (*pick).notPrefillFlags},
}

// filterNamed returns the filter row named name.
func filterNamed(name string) *filter {
	for i := range filters {
		if filters[i].name == name {
			return &filters[i]
		}
	}
	panic("policy: a profile row names no filter " + name) // a programming error, caught by every test
}

// Route modifiers: what changed the route before the replica choice, bits
// of the mask that indexes step.reasons, in the order the reason spells
// them; the checks' bits follow (modCheck << k for checks[k]). A fallback
// alias is a name, not a bit: it is joined in front (see reason).
const (
	modCanaryGone = 1 << iota
	modPoolFallback
	modPanic
	modCheck
)

var modReasons = [...]string{ReasonCanaryGone, ReasonPoolFallback, ReasonPanic}

func newStep(reason string, pick func(*pick) bool, why func(*pick, int) string, report func(*pick, *Decision)) step {
	s := step{reason: reason, pick: pick, why: why, report: report}
	s.reasons = make([]string, modCheck<<len(checks))
	var parts []string
	for mask := range len(s.reasons) {
		parts = parts[:0]
		for k, m := range modReasons {
			if mask&(1<<k) != 0 {
				parts = append(parts, m)
			}
		}
		parts = append(parts, reason)
		for k := range checks {
			if mask&(modCheck<<k) != 0 {
				parts = append(parts, checks[k].reason)
			}
		}
		s.reasons[mask] = strings.Join(parts, "+")
	}
	return s
}

// reason joins the fallback alias, the route modifiers, the deciding step
// and the checks that switched: "fallback:chat-small+pool-fallback-general+power-of-two".
func (p *pick) reason(fallback string, mods int) string {
	r := p.step.reasons[mods|int(p.switched)*modCheck]
	if fallback != "" {
		return ReasonFallback + fallback + "+" + r
	}
	return r
}

// choose walks the steps, then the checks. It returns the refusal of a
// check, nil when p.chosen stands.
func (p *pick) choose() *subjects.APIError {
	p.chosen, p.released = -1, -1
	p.step = p.prof.picker
	for _, s := range p.prof.steps {
		if s.pick(p) {
			p.step = s
			break
		}
	}
	if p.step == p.prof.picker {
		p.step.pick(p)
	}
	for k := range checks {
		switched, e := checks[k].check(p)
		if e != nil {
			return e
		}
		if switched {
			p.switched |= 1 << k
		}
	}
	return nil
}

// report writes what the rows found into d: the deciding step's report
// when no check switched away from its replica, and every check's.
func (p *pick) report(d *Decision) {
	if p.switched == 0 && p.step.report != nil {
		p.step.report(p, d)
	}
	for k := range checks {
		if checks[k].report != nil {
			checks[k].report(p, d)
		}
	}
}

// why says why candidate i lost to the chosen one: a check that switched
// or the release valve first, then the deciding step, then the load
// comparison.
func (p *pick) why(i int) string {
	for k := range checks {
		if w := checks[k].why(p, i); w != "" {
			return w
		}
	}
	if i == p.released {
		return p.releasedWhy
	}
	if p.step.why != nil {
		if w := p.step.why(p, i); w != "" {
			return w
		}
	}
	if p.cands[i].saturated {
		return WhySaturated
	}
	return p.prof.whyHigher
}
