package policy

import "math"

// Predicted TTFT: with policy.replica_choice "predicted-ttft", a request
// that no affinity step placed (no warm replica below the release
// threshold, or prefix affinity released its warm one) goes to the replica
// with the lowest predicted time to first token (replica.predict), counting
// the time its own prefill holds up the batch there, among the prefix
// holders (each predicted with the blocks it holds costing nothing) and a
// small sample of the pool (the power-of-two pair). Sampling, not the global minimum: every decider
// sending to the one least loaded replica between two heartbeats is the
// herd the seed warns about.
//
// A decider that is alone (no other decider live: Router.SetDeciders)
// herds with nobody: its own sends since each heartbeat are counted in
// what it sees. When it also reads the engines' KV-event feed (weighAll),
// it chooses over every candidate with
// fresh load data (predictedAlone), and prefix affinity leaves the choice
// to it. From placements, guesses of what each replica holds, the sampled
// choice stays: weighing every replica on them loses the cache hits the
// prefix benchmark's placements arm keeps (docs/lab/report.md, section 8).

// predictedHolders bounds the prefix holders weighed, and predictedLevels
// the prefix levels walked down from the deepest held one to find them.
const (
	predictedHolders = 4
	predictedLevels  = 4
)

// predictedTie is how close two predictions are to be a tie, as a share
// of the larger: load_score decides a tie. The learned prefill rates and
// base TTFTs differ between replicas by about that much in noise; without
// it the replica that happens to look fastest wins every pair it is drawn
// in, which the lab's herding experiment shows as imbalance power of two
// does not have.
const predictedTie = 0.25

// predictedPairTie is predictedTie between the two replicas of the sampled
// pair: a prediction there buys no cache hit the other lacks, and only a
// clear difference should override load_score. At 0.4 predicted TTFT's
// imbalance in the lab's herding experiment is at or below power of two's
// at every router count, where a quarter herds more (docs/lab/report.md,
// section 6). The holders keep the quarter: a wider margin there sends
// requests off their cached prefix and the predicted-TTFT + feed arm of
// the prefix benchmark falls behind the oracle (section 8).
const predictedPairTie = 0.4

// predictedSticky is the share of the request's prefix blocks a replica
// holds for the request to stay among such replicas when the decider is
// alone, and predictedReleaseWork how much less prefill work, in prompt
// tokens, the lightest replica of all must have to take it from them. The
// release is llm-d's prefix-cache-affinity filter's (its maximum TTFT
// penalty of 18 s at its peak prefill rate of 15 928 tokens/s: peers.go):
// a conversation stays with its cached turns until its replica is far
// behind. The share is below llm-d's 0.8: llm-d counts what it routed,
// this what the engine still holds and is about to hold, less once the
// engine has evicted a turn's tail; replaying Mooncake's conversation
// trace at capacity with seeds 1–7, 0.8 lost to llm-d-sticky's p90 TTFT
// with four seeds and 0.65 with one (docs/benchmarks.md, "Prefill work in
// the choice").
const (
	predictedSticky      = 0.65
	predictedReleaseWork = LLMDMaxTTFTPenaltyMs / 1000 * LLMDPeakPrefillPerSec
)

// predictedStep is the predicted-ttft step's state.
type predictedStep struct {
	// The holders weighed (candidate index and blocks held) and the
	// sampled pair.
	holders  [predictedHolders]int32
	held     [predictedHolders]int32
	nholders int
	pair     [2]int
	matched  int // blocks the chosen replica holds, 0 when not a holder
	// alone: predictedAlone chose; sticky is its choice among the
	// sticky holders (-1: none), released whether it gave way.
	alone    bool
	sticky   int
	released bool
}

// predicted chooses the lowest predicted TTFT among the prefix holders and
// the sampled pair; ties go to the lower load_score. It passes when the
// choice is power of two, with one candidate, or without fresh load data.
func (p *pick) predicted() bool {
	s := &p.pt
	s.nholders, s.matched, s.alone = 0, 0, false
	if len(p.cands) == 1 || p.nfresh == 0 {
		return false
	}
	if p.weighAll() {
		return p.predictedAlone()
	}
	p.weighHolders()
	s.pair = p.twoOf()
	best := s.pair[0]
	if p.betterTTFTWithin(s.pair[1], best, predictedPairTie) {
		best = s.pair[1]
	}
	for k := range s.nholders {
		if i := int(s.holders[k]); p.betterTTFT(i, best) {
			best = i
		}
	}
	p.chosen = best
	for k := range s.nholders {
		if int(s.holders[k]) == best {
			s.matched = int(s.held[k])
		}
	}
	return true
}

// betterTTFT compares two candidates by predicted TTFT plus the time their
// own prefill holds up the requests queued and running there (the whole
// batch waits for a prefill): a request sent away from its cached prefix
// costs the others there as much as it costs itself, which a greedy choice
// on its own TTFT would not count. Costs within predictedTie of each other
// go by load_score.
func (p *pick) betterTTFT(i, j int) bool { return p.betterTTFTWithin(i, j, predictedTie) }

// cost is candidate i's predicted TTFT plus the time its own prefill
// holds up the batch there, in ms.
func (p *pick) cost(i int) float64 {
	c := &p.cands[i]
	return c.ttft + c.x.prefillCost(c.uncached)
}

// betterTTFTWithin is betterTTFT with costs within tie of each other
// going by load_score.
func (p *pick) betterTTFTWithin(i, j int, tie float64) bool {
	a, b := &p.cands[i], &p.cands[j]
	if full := b.slotsAhead > 0; (a.slotsAhead > 0) != full && (a.x.slotMs == 0 || b.x.slotMs == 0) {
		// A full batch makes a request wait for a running one to end, an
		// unknown time without the replica's decode time: a replica with
		// room is the better bet.
		return full
	}
	ca, cb := p.cost(i), p.cost(j)
	if math.Abs(ca-cb) <= tie*max(ca, cb) {
		return a.load < b.load
	}
	return ca < cb || ca == cb && a.load < b.load
}

// weighHolders finds up to predictedHolders candidates holding the
// request's prefix, each at the deepest level it holds, and predicts each
// with its held blocks cached.
func (p *pick) weighHolders() {
	if len(p.req.Prefix) == 0 || (p.holders == nil && p.kv == nil) {
		return
	}
	blocks := p.req.Prefix
	top := p.deepestHeld(blocks, nil)
	for lvl := top; lvl >= 0 && lvl > top-predictedLevels && p.pt.nholders < predictedHolders; lvl-- {
		if m := p.holders; m != nil {
			if e := m.get(blocks[lvl]); e != nil {
				for _, x := range e.reps {
					if x != nil && x.mark == p.epoch && !x.kvLive {
						p.weighHolder(int(x.ci), lvl+1)
					}
				}
			}
		}
		if p.kv != nil {
			hs := p.kv.Lookup(p.kvModel, blocks[lvl])
			for i := range hs.Len() {
				if id := int(hs.At(i)); id < len(p.byKV) {
					if x := p.byKV[id]; x != nil && x.mark == p.epoch && x.kvLive {
						p.weighHolder(int(x.ci), lvl+1)
					}
				}
			}
		}
	}
}

func (p *pick) heldAnywhere(block uint64) bool {
	return (p.holders != nil && p.holders.find(block) >= 0) || (p.kv != nil && p.kv.Lookup(p.kvModel, block).Len() > 0)
}

// weighHolder predicts candidate ci with its held blocks cached, once: the
// first level it is found at is the deepest it holds.
func (p *pick) weighHolder(ci, held int) {
	s := &p.pt
	if s.nholders == predictedHolders {
		return
	}
	for k := range s.nholders {
		if int(s.holders[k]) == ci {
			return
		}
	}
	s.holders[s.nholders], s.held[s.nholders] = int32(ci), int32(held)
	s.nholders++
	p.credit(ci, held)
}

// credit predicts candidate ci with the held blocks of the request's
// prefix cached: they cost no prefill. A candidate keeps the most it was
// credited with: a walk from the deepest level up meets a holder again at
// every shallower level it holds.
func (p *pick) credit(ci, held int) {
	c := &p.cands[ci]
	if u := max(clamp32(p.req.PromptTokens)-int32(held)*p.blockTokens, 0); u < c.uncached {
		c.uncached = u
		c.ttft = c.x.predict(c.uncached, c.slotsAhead) + p.region.penalty()
	}
}

// weighAll reports whether predicted-ttft chooses over every candidate:
// the decider is alone, every candidate's load data is fresh and the pool
// is not in panic (a replica heard from again, or kept while silent, would
// look free), and the request has a prefix and the exact index holds some
// key (the engines' KV-event feed is on). Holders of a replica without the
// feed are still read from the placements (matchAll).
func (p *pick) weighAll() bool {
	return p.alone && p.prof.byTTFT && !p.panicked && p.kv != nil && len(p.cands) > 1 && p.nfresh == len(p.cands)
}

// predictedAlone chooses, over every candidate, the
// least prefill work ahead of the request's first token (work): among the
// replicas holding at least predictedSticky of its prefix when there are
// some, unless the lightest replica of all has less work than the
// lightest of them by more than predictedReleaseWork. Equal work goes to
// the lower load_score (a saturated replica's is higher), then at random.
func (p *pick) predictedAlone() bool {
	s := &p.pt
	s.alone, s.released = true, false
	p.matchAll()
	best, bestSticky, ties, tiesSticky := -1, -1, 0, 0
	for i := range p.cands {
		best, ties = p.lessWork(i, best, ties)
		if p.keeps(i) {
			bestSticky, tiesSticky = p.lessWork(i, bestSticky, tiesSticky)
		}
	}
	s.sticky, p.chosen = bestSticky, best
	if bestSticky >= 0 {
		if p.work(bestSticky)-p.work(best) <= predictedReleaseWork {
			p.chosen = bestSticky
		} else {
			s.released = true
		}
	}
	s.matched = int(p.cands[p.chosen].held)
	return true
}

// keeps reports whether candidate i holds at least the share of the
// request's prefix that keeps a request with it (predictedSticky), and is
// not at capacity (its queue full with its batch or KV cache): a full
// holder is a candidate like any other. The release threshold on kv_usage
// does not apply here: replaying Mooncake's traces, whose long prompts keep
// kv_usage high, applying it cost 26% of p90 TTFT at capacity; the work
// weighed already counts a holder's queue.
func (p *pick) keeps(i int) bool {
	c := &p.cands[i]
	return len(p.req.Prefix) > 0 && float64(c.held) >= predictedSticky*float64(len(p.req.Prefix)) && !c.full
}

// work is candidate i's prefill work ahead of the request's first token,
// in prompt tokens: what its heartbeat reported queued, what was sent since,
// and the request's own uncached tokens. The replicas are weighed at one
// rate: their learned rates and base TTFTs differ by noise that, followed,
// costs more than it tells (the lab's trace replay, docs/lab/report.md,
// section 12).
func (p *pick) work(i int) float64 {
	c := &p.cands[i]
	return c.x.inFlightTokens() + float64(c.uncached)
}

// lessWork returns i when it has less work than best (-1: none yet), or as
// much and a lower load_score; equal candidates share the choice at
// random, ties counting them.
func (p *pick) lessWork(i, best, ties int) (int, int) {
	if best < 0 {
		return i, 1
	}
	a, b := &p.cands[i], &p.cands[best]
	switch wa, wb := p.work(i), p.work(best); {
	case wa < wb, wa == wb && a.load < b.load:
		return i, 1
	case wa > wb || a.load != b.load:
		return best, ties
	}
	if ties++; p.rng.IntN(ties) == 0 {
		return i, ties
	}
	return best, ties
}

func (p *pick) whyPredicted(i int) string {
	s := &p.pt
	if s.alone {
		return p.whyAlone(i)
	}
	inPair := func(j int) bool { return j == s.pair[0] || j == s.pair[1] }
	weighed := inPair(i)
	for k := range s.nholders {
		weighed = weighed || int(s.holders[k]) == i
	}
	if !weighed {
		return WhyNotWeighed
	}
	// Costs within the tie went by load_score.
	tie := predictedTie
	if inPair(i) && inPair(p.chosen) {
		tie = predictedPairTie
	}
	if a, b := p.cost(i), p.cost(p.chosen); math.Abs(a-b) <= tie*max(a, b) {
		return p.prof.whyHigher
	}
	return WhyHigherTTFT
}

// whyAlone is why candidate i lost to predictedAlone's choice; "" when it
// had as much work as the replica it lost to (load_score or the draw
// decided).
func (p *pick) whyAlone(i int) string {
	s := &p.pt
	switch {
	case s.released && i == s.sticky:
		return WhyOutweighed
	case s.sticky >= 0 && !s.released && !p.keeps(i):
		return WhyNotSticky
	case p.work(i) == p.work(p.chosen):
		return ""
	}
	return WhyMoreWork
}

// reportPredicted reports the prefix blocks the chosen replica holds.
func (p *pick) reportPredicted(d *Decision) {
	d.PrefixMatched = p.pt.matched
	if p.pt.alone && p.pt.matched > 0 {
		d.PrefixSource = PrefixPlacements
		if p.cands[p.chosen].x.kvLive {
			d.PrefixSource = PrefixKVEvents
		}
	}
}

// deepestHeld is the index of the deepest of blocks some replica holds (-1:
// none), found by bisection: a chained block is held with every block
// before it. The blocks pending holds count too (nil: none): a block the
// engine stored left the pending table, so neither it nor the index alone
// is a chain.
func (p *pick) deepestHeld(blocks []uint64, pending *prefixMap) int {
	top := -1
	for lo, hi := 0, len(blocks); lo < hi; {
		mid := int(uint(lo+hi) >> 1)
		if p.heldAnywhere(blocks[mid]) || (pending != nil && pending.find(blocks[mid]) >= 0) {
			top, lo = mid, mid+1
		} else {
			hi = mid
		}
	}
	return top
}
