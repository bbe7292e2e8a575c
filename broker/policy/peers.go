package policy

import (
	"math"

	"github.com/switchyard-llm/switchyard/table"
)

// The peers' profiles: Dynamo's KV router, llm-d's precise-prefix and
// prefix-affinity profiles, and SGLang's (SMG's) cache-aware policy, each
// from its project's published design and source at the version named
// here, its knobs at that version's defaults. A team moving from one of
// those routers selects the behaviour it knows (policy.profile,
// pools.<pool>.profile) and A/Bs it against Switchyard's own.
//
// Where each reads its knowledge of the caches: Dynamo and llm-d's precise
// profile from the engines' KV-cache events (the exact index, for replicas
// whose feed is live), SGLang's approximate radix tree and llm-d's
// approximate prefix producer from what the router itself sent where (the
// placement map). A replica is read from whichever of the two Switchyard
// has for it, as prefix affinity does.
const (
	// DynamoVersion: lib/kv-router/src/scheduling/selector.rs and
	// docs/router/README.md, ai-dynamo/dynamo at commit
	// 01690d42e3b9436ab3a6a365fc9beabf58c105c6.
	DynamoVersion = "ai-dynamo/dynamo@01690d42e3b9436ab3a6a365fc9beabf58c105c6"
	// LLMDVersion: llm-d-router after v0.10.0-rc.1 (the v0.10.0 line):
	// the prefix-cache-affinity filter, token-load, queue,
	// kv-cache-utilization and prefix-cache scorers; the precise profile's
	// weights are its guide's (llm-d/llm-d
	// guides/precise-prefix-cache-aware/scheduler/precise-prefix-cache-aware.values.yaml
	// at 019a3f3fb1c1ef672194408d3427e7ecd770b8bb, and the router's
	// deploy/config/epp-precise-prefix-cache-config.yaml).
	LLMDVersion = "llm-d/llm-d-router@ebab687927f5331c1b39defcb579a07951bce56c (v0.10.0-rc.1+62)"
	// SGLangVersion: model_gateway/src/policies/cache_aware.rs and
	// CacheAwareConfig's defaults in policies/mod.rs.
	SGLangVersion = "lightseekorg/smg@73da68ca9472bbc0ff5f63d31a8a21fbb8696359"
)

// Dynamo's KvRouterConfig defaults: overlap_score_credit 1 (a cached
// block is not prefilled), prefill_load_scale 1, router_temperature 0
// (the lowest cost wins), decode_active_request_weight 0.
const (
	DynamoPrefillLoadScale = 1.0
	DynamoOverlapCredit    = 1.0
)

// llm-d's defaults: the precise-prefix guide weighs
// precise-prefix-cache-scorer 2, kv-cache-utilization-scorer 1 and
// queue-scorer 1 under a max-score picker; the prefix-cache-affinity filter keeps the
// replicas whose prefix score is at least 0.80 unless the best of them
// would wait more than 18 s longer for its first token than the best of the
// rest, the wait estimated as in-flight prompt tokens at 15 928 tokens/s;
// token-load-scorer normalizes in-flight tokens by 4 Mi (4 194 304).
const (
	LLMDPrefixWeight       = 2.0
	LLMDKVWeight           = 1.0
	LLMDQueueWeight        = 1.0
	LLMDAffinityThreshold  = 0.80
	LLMDMaxTTFTPenaltyMs   = 18000.0
	LLMDPeakPrefillPerSec  = 15928.0
	LLMDQueueThresholdToks = 4194304.0
)

// SGLang's (SMG's) CacheAwareConfig defaults: a cache hit needs more than
// half the request matched; the pool is imbalanced when the busiest
// worker's requests exceed the idlest's by more than 32 and by more than
// 1.1 times.
const (
	SGLangCacheThreshold = 0.5
	SGLangBalanceAbs     = 32
	SGLangBalanceRel     = 1.1
)

// Decision reasons of the peers' steps.
const (
	ReasonLowestScore   = "lowest-score"              // the lowest weighted sum of the profile's scorers (Dynamo's cost, llm-d's max score)
	ReasonTTFTGate      = "affinity-ttft-gate-broken" // llm-d-sticky: the sticky replicas' wait is past the penalty: every replica by token load
	ReasonStickyPrefix  = "prefix-cache-affinity"     // llm-d-sticky: among the replicas holding ≥ 80% of the prefix, by token load
	ReasonImbalanced    = "imbalanced-shortest-queue" // sglang: the pool is imbalanced: the fewest outstanding requests
	ReasonCacheMatch    = "cache-aware-match"         // sglang: more than cache_threshold of the request matched: the deepest holder
	ReasonShortestQueue = "cache-miss-shortest-queue" // sglang: no replica matched enough: the fewest outstanding requests
)

// Why a candidate lost to a peer step.
const (
	WhyNotSticky = "prefix below the affinity threshold"
)

// peerState is what a dynamic profile's pre-pass (rescore) found for the
// decision: the scorer values, the queue bounds, and the sticky set. Each
// candidate's held prefix blocks are its cand.held (matchAll).
type peerState struct {
	vals               [][table.MaxScorers]float64
	minWait, maxWait   int32
	nsticky            int
	bestSticky, bestNS float64 // llm-d: the lowest wait (ms) among the sticky and the other replicas
}

// rescore works out the request-dependent scorers of a dynamic profile for
// every candidate, and its score: the weighted sum, as renew does for the
// others.
func (p *pick) rescore() {
	s := &p.peer
	n := len(p.cands)
	if cap(s.vals) < n {
		s.vals = make([][table.MaxScorers]float64, 2*n)
	}
	s.vals = s.vals[:n]
	p.matchAll()
	s.minWait, s.maxWait = math.MaxInt32, math.MinInt32
	for i := range p.cands {
		w := p.cands[i].x.waiting
		s.minWait, s.maxWait = min(s.minWait, w), max(s.maxWait, w)
	}
	for i := range p.cands {
		c := &p.cands[i]
		v := &s.vals[i]
		total := 0.0
		for k, sc := range p.prof.scorers {
			val := c.x.scored.values[k]
			if sc.perRequest != nil {
				val = sc.perRequest(p, i)
			}
			v[k] = val
			total += p.prof.weights[k] * val
		}
		c.load = total
	}
}

// matchAll finds how many of the request's prefix blocks each candidate
// holds (cand.held), deepest first (a chained block is held with every
// block before it), and credits them: they cost no prefill. A replica
// without the KV-event feed is read from the placements; one with it from
// the exact index and, for a decider alone with predicted-ttft, from the
// pending blocks (loadView.pending; p.pending is nil otherwise): what was
// sent to it that its engine has not reported stored or evicted yet, a
// request queued there that will find its blocks cached.
func (p *pick) matchAll() {
	m, pm := p.holders, p.pending
	if (m == nil && p.kv == nil) || len(p.req.Prefix) == 0 {
		return
	}
	blocks := p.req.Prefix
	top := p.deepestHeld(blocks, pm)
	left := len(p.cands)
	mark := func(x *replica, lvl int) {
		if x != nil && x.mark == p.epoch && p.cands[x.ci].held == 0 {
			p.cands[x.ci].held = int32(lvl + 1)
			p.credit(int(x.ci), lvl+1)
			left--
		}
	}
	// from marks the replicas m names for block lvl whose feed is live or
	// not, as fed says.
	from := func(m *prefixMap, fed bool, lvl int) {
		if m == nil {
			return
		}
		if e := m.get(blocks[lvl]); e != nil {
			for _, x := range e.reps {
				if x != nil && x.kvLive == fed {
					mark(x, lvl)
				}
			}
		}
	}
	for lvl := top; lvl >= 0 && left > 0; lvl-- {
		from(m, false, lvl)
		from(pm, true, lvl)
		if p.kv != nil {
			hs := p.kv.Lookup(p.kvModel, blocks[lvl])
			for i := range hs.Len() {
				if id := int(hs.At(i)); id < len(p.byKV) {
					if x := p.byKV[id]; x != nil && x.kvLive {
						mark(x, lvl)
					}
				}
			}
		}
	}
}

// engineBlock is the tokens of one of x's KV blocks, as its heartbeat
// says, else the policy's prefix block.
func (p *pick) engineBlock(x *replica) float64 {
	if x.hb.BlockSize > 0 {
		return float64(x.hb.BlockSize)
	}
	return float64(max(p.blockTokens, 1))
}

// inFlightTokens is the prompt tokens sent to x that have not had their
// first token: what its heartbeat reported queued, and what was sent since.
func (x *replica) inFlightTokens() float64 {
	return float64(int64(x.queuedPrefill) + int64(x.sentPrefill))
}

// prefillBlocks is Dynamo's prefill cost: the prefill tokens x would have
// if the request went there (its active prefill plus the request's
// uncached tokens), in KV blocks, scaled by the prefill load scale.
func prefillBlocks(p *pick, i int) float64 {
	c := &p.cands[i]
	return DynamoPrefillLoadScale * (c.x.inFlightTokens() + float64(c.uncached)) / p.engineBlock(c.x)
}

// decodeBlocks is Dynamo's decode cost: the KV blocks x's running
// requests hold (its heartbeat's kv_usage times its KV blocks).
func decodeBlocks(x *replica, _ *scoredView) float64 {
	if x.hb.KVBlocks > 0 {
		return x.kv * float64(x.hb.KVBlocks)
	}
	return x.kv
}

// prefixCache is 1 − llm-d's prefix-cache score: the share of the
// request's prefix blocks the replica does not hold.
func prefixCache(p *pick, i int) float64 {
	n := len(p.req.Prefix)
	if n == 0 {
		return 1
	}
	return 1 - float64(p.cands[i].held)/float64(n)
}

// queueScore is 1 − llm-d's queue score: the replica's waiting requests,
// min-max normalized over the candidates (0 for all when they are equal).
func queueScore(p *pick, i int) float64 {
	s := &p.peer
	if s.maxWait == s.minWait {
		return 0
	}
	return float64(p.cands[i].x.waiting-s.minWait) / float64(s.maxWait-s.minWait)
}

// tokenLoad is 1 − llm-d's token-load score: the replica's in-flight
// prompt tokens plus the request's uncached ones, over the threshold.
func tokenLoad(p *pick, i int) float64 {
	c := &p.cands[i]
	return min(1, (c.x.inFlightTokens()+float64(c.uncached))/LLMDQueueThresholdToks)
}

// requests is SGLang's load: the replica's outstanding requests, running
// and waiting, with what was sent or ended since its heartbeat.
func requests(x *replica, _ *scoredView) float64 {
	return float64(max(int64(x.running)+int64(x.waiting)+int64(x.inflight)+int64(x.delta), 0))
}

// lowest chooses the candidate with the lowest score among those keep
// accepts (nil: all), ties at random; -1 when keep accepts none.
func (p *pick) lowest(keep func(i int) bool) int {
	best, ties := -1, 0
	for i := range p.cands {
		if keep != nil && !keep(i) {
			continue
		}
		switch l := p.cands[i].load; {
		case best < 0 || l < p.cands[best].load:
			best, ties = i, 1
		case l == p.cands[best].load:
			if ties++; p.rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	return best
}

// lowestScore is the peers' picker: the lowest weighted sum (Dynamo's
// lowest cost at temperature 0, llm-d's max-score picker).
func (p *pick) lowestScore() bool {
	p.chosen = p.lowest(nil)
	return true
}

// sticky reports whether candidate i holds at least llm-d's affinity
// threshold of the request's prefix.
func (p *pick) sticky(i int) bool {
	n := len(p.req.Prefix)
	return n > 0 && float64(p.cands[i].held)/float64(n) >= LLMDAffinityThreshold
}

// ttftGate is the load gate of llm-d's prefix-cache-affinity filter: when
// the sticky replicas' best estimated wait exceeds the others' best by more
// than the penalty, stickiness is broken and every replica is scored.
func (p *pick) ttftGate() bool {
	s := &p.peer
	s.nsticky, s.bestSticky, s.bestNS = 0, math.MaxFloat64, math.MaxFloat64
	for i := range p.cands {
		wait := p.cands[i].x.inFlightTokens() / LLMDPeakPrefillPerSec * 1000
		if p.sticky(i) {
			s.nsticky++
			s.bestSticky = min(s.bestSticky, wait)
		} else {
			s.bestNS = min(s.bestNS, wait)
		}
	}
	if s.nsticky == 0 || s.nsticky == len(p.cands) || s.bestSticky-s.bestNS <= LLMDMaxTTFTPenaltyMs {
		return false
	}
	p.chosen = p.lowest(nil)
	return true
}

// stickyPrefix narrows the choice to the sticky replicas, the lowest token
// load among them.
func (p *pick) stickyPrefix() bool {
	if p.peer.nsticky == 0 {
		return false
	}
	p.chosen = p.lowest(p.sticky)
	return true
}

func (p *pick) whySticky(i int) string {
	if !p.sticky(i) {
		return WhyNotSticky
	}
	return ""
}

// imbalanced is SGLang's load check: when the busiest replica's requests
// exceed the idlest's by more than the absolute threshold and by more than
// the relative one, the fewest outstanding requests win, cache or not.
func (p *pick) imbalanced() bool {
	lo, hi := math.MaxFloat64, -1.0
	for i := range p.cands {
		l := p.cands[i].load
		lo, hi = min(lo, l), max(hi, l)
	}
	if !(hi-lo > SGLangBalanceAbs && hi > lo*SGLangBalanceRel) {
		return false
	}
	p.chosen = p.fewest()
	return true
}

// fewest is the first candidate with the fewest outstanding requests, as
// SMG's min-load index.
func (p *pick) fewest() int {
	best := 0
	for i := range p.cands {
		if p.cands[i].load < p.cands[best].load {
			best = i
		}
	}
	return best
}

// cacheMatch is SGLang's cache-aware choice: when more than the cache
// threshold of the request's prompt is matched, the replica holding the
// longest match (the fewest requests among equals). The match rate is over
// the prompt the prefix header covers.
func (p *pick) cacheMatch() bool {
	best := -1
	for i := range p.cands {
		m := p.cands[i].held
		if m > 0 && (best < 0 || m > p.cands[best].held || m == p.cands[best].held && p.cands[i].load < p.cands[best].load) {
			best = i
		}
	}
	if best < 0 {
		return false
	}
	// The share of the prompt the prefix header covers (a long prompt's
	// header stops at prefix_max_blocks: what lies past it is unknown, as
	// if unmatched would wrongly be).
	covered := min(max(p.req.PromptTokens, 1), len(p.req.Prefix)*int(p.blockTokens))
	rate := min(1, float64(p.cands[best].held)*float64(p.blockTokens)/float64(covered))
	if rate <= SGLangCacheThreshold {
		return false
	}
	p.chosen = best
	return true
}

func (p *pick) whyCacheMatch(i int) string {
	if p.cands[i].held < p.cands[p.chosen].held {
		return WhyShorterPrefix
	}
	return ""
}

// shortestQueue is SGLang's cache miss: the fewest outstanding requests.
func (p *pick) shortestQueue() bool {
	p.chosen = p.fewest()
	return true
}

// reportPeer reports the prefix blocks the chosen replica holds.
func (p *pick) reportPeer(d *Decision) {
	d.PrefixMatched = int(p.cands[p.chosen].held)
}

// valuesOf is candidate i's scorer values: worked out for this request
// when the profile is dynamic, else its load view's.
func (p *pick) valuesOf(i int) [table.MaxScorers]float64 {
	if p.prof.dynamic {
		return p.peer.vals[i]
	}
	return p.cands[i].x.scored.values
}
