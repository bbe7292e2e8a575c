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

// predictedStep is the predicted-ttft step's state.
type predictedStep struct {
	// The holders weighed (candidate index and blocks held) and the
	// sampled pair.
	holders  [predictedHolders]int32
	held     [predictedHolders]int32
	nholders int
	pair     [2]int
	matched  int // blocks the chosen replica holds, 0 when not a holder
}

// predicted chooses the lowest predicted TTFT among the prefix holders and
// the sampled pair; ties go to the lower load_score. It passes when the
// choice is power of two, with one candidate, or without fresh load data.
func (p *pick) predicted() bool {
	s := &p.pt
	s.nholders, s.matched = 0, 0
	if len(p.cands) == 1 || p.nfresh == 0 {
		return false
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
	top := p.deepestHeld(blocks)
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

func (p *pick) whyPredicted(i int) string {
	s := &p.pt
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

// reportPredicted reports the prefix blocks the chosen replica holds.
func (p *pick) reportPredicted(d *Decision) {
	d.PrefixMatched = p.pt.matched
}

// deepestHeld is the index of the deepest of blocks some replica holds (-1:
// none), found by bisection: a chained block is held with every block
// before it.
func (p *pick) deepestHeld(blocks []uint64) int {
	top := -1
	for lo, hi := 0, len(blocks); lo < hi; {
		mid := int(uint(lo+hi) >> 1)
		if p.heldAnywhere(blocks[mid]) {
			top, lo = mid, mid+1
		} else {
			hi = mid
		}
	}
	return top
}
