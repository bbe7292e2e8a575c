package policy

import "github.com/switchyard-llm/switchyard/table"

// scorer declares one scorer: a value for each replica, lower is better,
// worked out from the replica's own state once per load-view update
// (renew), so a decision reads one weighted sum per candidate from a slice
// instead of calling each scorer for each candidate. A profile weighs its
// scorers; its picker compares the sums.
type scorer struct {
	// name is the scorer's name in the table (table.Scorers) and in a
	// decision's explanation.
	name string
	// value is the replica's value, from its load view with everything but
	// the profile's total filled in.
	value func(x *replica, v *scoredView) float64
	// perRequest, when set, is the value instead, worked out at each
	// decision because it reads the request (its prefix blocks held, its
	// uncached tokens) or the other candidates: p.rescore calls it for
	// candidate i once the decision's pre-pass (p.peer) is done. A profile
	// with one is dynamic.
	perRequest func(p *pick, i int) float64
}

// scorers is every scorer a profile may weigh, in table.Scorers's order.
// Adding a scorer is its file, with its value method, and its row here
// (and its name in table.Scorers, which validates the table).
var scorers = [...]scorer{
	{name: table.ScorerDecodeBlocks, value: decodeBlocks},
	{name: table.ScorerKVUsage, value: kvUsage},
	{name: table.ScorerLoad, value: loadScore},
	{name: table.ScorerPrefillBlocks, value: zero, perRequest: prefillBlocks},
	{name: table.ScorerPrefixCache, value: zero, perRequest: prefixCache},
	{name: table.ScorerQueue, value: zero, perRequest: queueScore},
	{name: table.ScorerRequests, value: requests},
	{name: table.ScorerSaturated, value: saturated},
	{name: table.ScorerTokenLoad, value: zero, perRequest: tokenLoad},
}

// zero is the load-view value of a scorer that reads the request: it has
// none until a decision works it out.
func zero(*replica, *scoredView) float64 { return 0 }

// scorerNamed returns the row of name, nil when there is none.
func scorerNamed(name string) *scorer {
	for i := range scorers {
		if scorers[i].name == name {
			return &scorers[i]
		}
	}
	return nil
}

// loadScore is the seed's load_score, with policy.load_weights (load).
func loadScore(_ *replica, v *scoredView) float64 { return v.score }

// saturated is 1 for a saturated replica (kv ≥ saturation_kv, or its queue
// full): weighed by SaturationPenalty in the default profile, it sorts
// after every unsaturated one but stays a candidate, because excluding
// saturated replicas cascades the load onto the others.
func saturated(_ *replica, v *scoredView) float64 {
	if v.saturated {
		return 1
	}
	return 0
}
