package table

import (
	"math"
	"slices"
	"sort"
)

// Profiles a table may select (policy.profile, pools.<pool>.profile). A
// profile is the replica choice of broker/policy: the steps tried first,
// the scorers with their weights, and the picker. Each name here has its
// profile there, and each scorer name its scorer row (a policy test checks
// both ways).
const (
	ProfileSwitchyard = "switchyard" // the default: the seed's rules, then power of two by load_score
	// The peers' own algorithms, for a team moving from one of those
	// routers: it starts with the behaviour it knows and A/Bs it against
	// Switchyard's on a canary pool.
	ProfileDynamoKV         = "dynamo-kv"          // Dynamo's KV router cost: prefill blocks + decode blocks, lowest wins
	ProfileLLMDPrecise      = "llm-d-precise"      // llm-d's precise prefix profile: prefix-cache, KV-utilization and queue scorers
	ProfileLLMDSticky       = "llm-d-sticky"       // llm-d's prefix-cache-affinity filter with the token-load scorer
	ProfileSGLangCacheAware = "sglang-cache-aware" // SGLang's / SMG's cache-aware policy: radix match, shortest-queue fallback
)

// Scorers a profile weighs (policy.scorers, pools.<pool>.scorers): each
// gives every candidate a value, once per load-view update or, for those
// that read the request, at each decision, and the profile's picker
// compares the weighted sums, the lowest first.
const (
	ScorerLoad      = "load_score" // the seed's load_score, weighted by policy.load_weights
	ScorerSaturated = "saturated"  // 1 for a saturated replica: deprioritized, never excluded
	ScorerKVUsage   = "kv_usage"   // the replica's KV-cache usage

	// The peers' scorers. Those that read the request (its prefix, its
	// prompt tokens) are worked out at each decision.
	ScorerPrefillBlocks = "prefill_blocks" // Dynamo: prefill tokens the replica would still compute (queued + the request's uncached), in KV blocks
	ScorerDecodeBlocks  = "decode_blocks"  // Dynamo: the KV blocks its running requests hold
	// llm-d's scorers are higher-is-better in [0, 1]; each value here is
	// 1 − llm-d's score, so the lowest sum wins as everywhere (llm-d's
	// kv-cache-utilization scorer is 1 − kv_usage: kv_usage).
	ScorerPrefixCache = "prefix_cache" // llm-d: 1 − the share of the request's prefix blocks the replica holds
	ScorerQueue       = "queue"        // llm-d: waiting requests, min-max normalized over the candidates
	ScorerTokenLoad   = "token_load"   // llm-d: (in-flight prompt tokens + the request's uncached) / 4 Mi, at most 1
	ScorerRequests    = "requests"     // SGLang: the replica's outstanding requests (running and waiting)
)

// Profiles returns the names of the profiles, in name order.
func Profiles() []string {
	return []string{ProfileDynamoKV, ProfileLLMDPrecise, ProfileLLMDSticky, ProfileSGLangCacheAware, ProfileSwitchyard}
}

// Scorers returns the names of the scorers, in name order.
func Scorers() []string {
	return []string{ScorerDecodeBlocks, ScorerKVUsage, ScorerLoad, ScorerPrefillBlocks, ScorerPrefixCache,
		ScorerQueue, ScorerRequests, ScorerSaturated, ScorerTokenLoad}
}

// MaxScorers bounds the scorers one profile weighs: a decision keeps each
// scorer's value for the chosen replica and its best losers in arrays of
// this size.
const MaxScorers = 4

// ProfileOf returns the profile selected for pool: the pool's, else the
// policy's, else ProfileSwitchyard.
func (s *Snapshot) ProfileOf(pool string) string {
	if p := s.Pools[pool]; p != nil && p.Profile != "" {
		return p.Profile
	}
	if s.Policy.Profile != "" {
		return s.Policy.Profile
	}
	return ProfileSwitchyard
}

func validateProfile(key, name string) error {
	if name != "" && !slices.Contains(Profiles(), name) {
		return fieldErr(key, "profile", "unknown profile %q (want one of %v)", name, Profiles())
	}
	return nil
}

func validateScorers(key string, w map[string]float64) error {
	names := make([]string, 0, len(w))
	for n := range w {
		names = append(names, n)
	}
	sort.Strings(names) // the first bad one in name order, whatever the map's order
	for _, n := range names {
		switch v := w[n]; {
		case !slices.Contains(Scorers(), n):
			return fieldErr(key, "scorers", "unknown scorer %q (want one of %v)", n, Scorers())
		case v < 0 || math.IsNaN(v) || math.IsInf(v, 0):
			return fieldErr(key, "scorers."+n, "a weight must be a finite number ≥ 0, got %v", v)
		}
	}
	if len(w) > MaxScorers {
		return fieldErr(key, "scorers", "at most %d scorers, got %d", MaxScorers, len(w))
	}
	return nil
}
