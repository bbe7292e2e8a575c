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
}

// scorers is every scorer a profile may weigh, in table.Scorers's order.
// Adding a scorer is its file, with its value method, and its row here
// (and its name in table.Scorers, which validates the table).
var scorers = [...]scorer{
	{name: table.ScorerKVUsage, value: kvUsage},
	{name: table.ScorerLoad, value: loadScore},
	{name: table.ScorerSaturated, value: saturated},
}

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
