package policy

import (
	"maps"
	"slices"

	"github.com/switchyard-llm/switchyard/table"
)

// A profile is one way of choosing a replica: its filters, which make the
// candidates, its steps, tried in order, each of which may decide (the
// seed's affinity rules and the stale-load guard), its scorers with their
// weights, and its picker, which decides when no step did, from the
// weighted sum of the scorers' values (the candidate's score). The table
// selects a profile by name (policy.profile, pools.<pool>.profile) and may
// weigh its scorers otherwise (policy.scorers, pools.<pool>.scorers).

// weight is one scorer of a profile row and its weight.
type weight struct {
	scorer string
	w      float64
}

// profileRow declares one profile, by the names of its rows.
type profileRow struct {
	name    string
	filters []string // filter names, in order
	steps   []string // step reasons, in order
	picker  string   // the step that decides when none of steps did
	scorers []weight
	// request: the steps read the request's prefix blocks held by each
	// candidate (the pre-pass of a dynamic profile, rescore).
	request bool
}

// profileRows are the profiles a table may select (table.Profiles).
var profileRows = [...]profileRow{
	{
		name:    table.ProfileSwitchyard,
		filters: []string{"live", "not-ejected", "not-excluded", "pinned", "serves-endpoint", "not-prefill"},
		// predicted-ttft is in force only with policy.replica_choice
		// predicted-ttft (resolve leaves it out otherwise).
		steps: []string{ReasonResponse, ReasonSession, ReasonLora, ReasonPrefix, ReasonPredicted, ReasonOnly,
			ReasonStaleRandom},
		picker:  ReasonPowerOfTwo,
		scorers: []weight{{table.ScorerLoad, 1}, {table.ScorerSaturated, SaturationPenalty}},
	},
	// The peers' (peers.go). None applies Switchyard's affinity steps; a
	// stored response still pins its replica.
	{
		name:    table.ProfileDynamoKV,
		filters: []string{"live", "not-ejected", "not-excluded", "pinned", "serves-endpoint", "not-prefill"},
		steps:   []string{ReasonResponse, ReasonOnly},
		picker:  ReasonLowestScore,
		scorers: []weight{{table.ScorerPrefillBlocks, 1}, {table.ScorerDecodeBlocks, 1}},
		request: true,
	},
	{
		name:    table.ProfileLLMDPrecise,
		filters: []string{"live", "not-ejected", "not-excluded", "pinned", "serves-endpoint", "not-prefill"},
		steps:   []string{ReasonResponse, ReasonOnly},
		picker:  ReasonLowestScore,
		scorers: []weight{{table.ScorerPrefixCache, LLMDPrefixWeight}, {table.ScorerKVUsage, LLMDKVWeight}, {table.ScorerQueue, LLMDQueueWeight}},
		request: true,
	},
	{
		name:    table.ProfileLLMDSticky,
		filters: []string{"live", "not-ejected", "not-excluded", "pinned", "serves-endpoint", "not-prefill"},
		steps:   []string{ReasonResponse, ReasonOnly, ReasonTTFTGate, ReasonStickyPrefix},
		picker:  ReasonLowestScore,
		scorers: []weight{{table.ScorerTokenLoad, 1}},
		request: true,
	},
	{
		name:    table.ProfileSGLangCacheAware,
		filters: []string{"live", "not-ejected", "not-excluded", "pinned", "serves-endpoint", "not-prefill"},
		steps:   []string{ReasonResponse, ReasonOnly, ReasonImbalanced, ReasonCacheMatch},
		picker:  ReasonShortestQueue,
		scorers: []weight{{table.ScorerRequests, 1}},
		request: true,
	},
}

// profile is a profile row resolved against a table: its rows, and its
// scorers with the table's weights. It is built with the table and never
// written afterwards.
type profile struct {
	name    string
	filters []*filter
	steps   []*step
	picker  *step
	// byTTFT: policy.replica_choice is predicted-ttft: the predicted-ttft
	// step is in force, and prefix affinity ranks the holders of a prefix
	// by predicted TTFT instead of kv_usage.
	byTTFT bool
	// predicts: the profile has the predicted-ttft step in force (only
	// the switchyard profile, with byTTFT).
	predicts bool
	// dynamic: a scorer or a step reads the request, so each decision
	// works the candidates' scores out again (rescore) before the steps.
	dynamic bool

	scorers []*scorer
	weights []float64
	names   []string // the scorers' names, for the explanation
	// whyHigher is what a loser on score lost by: "higher load_score"
	// while load_score (and the saturation penalty) is the whole score.
	whyHigher string
}

// profiles is the table's profiles: the policy's, and each pool's that
// selects another profile or weighs the scorers otherwise.
type profiles struct {
	policy *profile
	pools  map[string]*profile
}

// of returns pool's profile.
func (ps *profiles) of(pool string) *profile {
	if p := ps.pools[pool]; p != nil {
		return p
	}
	return ps.policy
}

// newProfiles resolves the table's profiles. A name or a scorer the
// table package validated but no row declares falls back to the default
// profile and leaves the scorer out: the table decides only what the rows
// can do.
func newProfiles(s *table.Snapshot) profiles {
	ps := profiles{policy: resolve(s, s.Policy.Profile, s.Policy.Scorers, nil)}
	for name, pool := range s.Pools {
		if pool.Profile != "" || len(pool.Scorers) > 0 {
			if ps.pools == nil {
				ps.pools = map[string]*profile{}
			}
			ps.pools[name] = resolve(s, s.ProfileOf(name), s.Policy.Scorers, pool.Scorers)
		}
	}
	return ps
}

func resolve(s *table.Snapshot, name string, policyWeights, poolWeights map[string]float64) *profile {
	row := &profileRows[0]
	for i := range profileRows {
		if profileRows[i].name == name {
			row = &profileRows[i]
		}
	}
	p := &profile{name: row.name, byTTFT: s.Policy.ReplicaChoice == table.ChoicePredictedTTFT, dynamic: row.request}
	for _, name := range row.filters {
		p.filters = append(p.filters, filterNamed(name))
	}
	for _, reason := range row.steps {
		if reason == ReasonPredicted && !p.byTTFT {
			continue
		}
		p.steps = append(p.steps, stepNamed(reason))
		p.predicts = p.predicts || reason == ReasonPredicted
	}
	p.picker = stepNamed(row.picker)
	// The row's scorers in its order, then those the table adds, in name
	// order; the table's weights replace the row's, and 0 leaves one out.
	ws := make([]weight, 0, table.MaxScorers)
	ws = append(ws, row.scorers...)
	for _, set := range []map[string]float64{policyWeights, poolWeights} {
		for _, n := range slices.Sorted(maps.Keys(set)) {
			k := slices.IndexFunc(ws, func(w weight) bool { return w.scorer == n })
			if k < 0 {
				ws = append(ws, weight{n, set[n]})
			} else {
				ws[k].w = set[n]
			}
		}
	}
	loadOnly := true
	for _, w := range ws {
		sc := scorerNamed(w.scorer)
		if sc == nil || w.w == 0 || len(p.scorers) == table.MaxScorers {
			continue
		}
		p.scorers, p.weights, p.names = append(p.scorers, sc), append(p.weights, w.w), append(p.names, sc.name)
		p.dynamic = p.dynamic || sc.perRequest != nil
		loadOnly = loadOnly && (sc.name == table.ScorerLoad || sc.name == table.ScorerSaturated)
	}
	p.whyHigher = WhyHigherScore
	if loadOnly {
		p.whyHigher = WhyHigherLoad
	}
	return p
}

// stepNamed returns the step row whose reason is reason.
func stepNamed(reason string) *step {
	for i := range steps {
		if steps[i].reason == reason {
			return &steps[i]
		}
	}
	panic("policy: a profile row names no step " + reason) // a programming error, caught by every test
}
