package policy

import (
	"slices"

	"github.com/switchyard-llm/switchyard/broker/policy/kvindex"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// Disaggregated serving: the split check of the checks table, and the
// not-prefill filter that keeps prefill replicas out of whole placements.

// Why a request of a disaggregated model is split or served whole
// (Decision.Split).
const (
	SplitPrefill        = "split"                            // uncached prompt tokens reach min_uncached_tokens: prefill leg elsewhere
	SplitWholeShort     = "whole: below min_uncached_tokens" // a short or mostly cached prompt costs less than the transfer
	SplitWholeNoPrefill = "whole: no prefill replica"        // none live, in rotation and with room: the decode replica prefills
	SplitWholeEndpoint  = "whole: endpoint"                  // only chat and completions have a prefill leg
	SplitWholeResume    = "whole: continuation"              // a continuation is admitted once, as it came
	SplitWholePinned    = "whole: pinned"                    // a stored conversation stays on its replica
)

// prefixSource is what the split asks of the prefix knowledge: how many
// leading blocks of a request's chain replica x holds. The prefix map
// answers from the placements brokers made; an index fed by the engines'
// KV-cache events answers the same question exactly.
type prefixSource interface {
	heldBy(blocks []uint64, x *replica) int
}

var (
	_ prefixSource = (*prefixMap)(nil)
	_ prefixSource = (*prefixHoldings)(nil)
)

// prefixHoldings is the prefix knowledge a decision has: the exact index
// for replicas whose adapter feeds their engine's KV-cache events, the
// placement map for the others, each replica read from its own source as
// prefix affinity reads it.
type prefixHoldings struct {
	m     *prefixMap     // nil: no placements for the model
	kv    *kvindex.Index // nil: no exact keys
	model string
}

func (h *prefixHoldings) heldBy(blocks []uint64, x *replica) int {
	if x.kvLive {
		if h.kv == nil {
			return 0
		}
		for lvl := len(blocks) - 1; lvl >= 0; lvl-- {
			hs := h.kv.Lookup(h.model, blocks[lvl])
			for i := range hs.Len() {
				if hs.At(i) == x.kvID {
					return lvl + 1
				}
			}
		}
		return 0
	}
	if h.m == nil {
		return 0
	}
	return h.m.heldBy(blocks, x)
}

// heldBy is the depth of the longest chain of blocks whose last block x
// received: chained hashes make a block stand for every block before it.
func (m *prefixMap) heldBy(blocks []uint64, x *replica) int {
	for lvl := len(blocks) - 1; lvl >= 0; lvl-- {
		if e := m.get(blocks[lvl]); e != nil && slices.Contains(e.reps[:], x) {
			return lvl + 1
		}
	}
	return 0
}

// notPrefill: a prefill replica computes prompts for decode replicas and
// is never given a whole request.
func (p *pick) notPrefill(x *replica) bool { return !x.prefillOnly }

// splitCheck is the split check's state: the model's disaggregation, the
// replicas a prefill leg may go to, and what it decided.
type splitCheck struct {
	on          *table.Disaggregation // nil: the model is served whole
	group       []*replica            // the model's registered replicas
	w           *table.LoadWeights
	src         prefixHoldings
	held        prefixSource // &src, or nil when nothing is known of prefixes
	blockTokens int          // prompt tokens per prefix block

	prefill  *replica // the prefill replica chosen, nil: whole
	uncached int
	why      string
}

// start readies the check for a decision of model m with the replicas of
// that model.
func (c *splitCheck) start(m *table.Model, group []*replica, pol *table.Policy, src prefixHoldings) {
	*c = splitCheck{}
	if !m.Splits() {
		return
	}
	c.on, c.group, c.w = m.Disaggregation, group, &pol.LoadWeights
	if src.m != nil || src.kv != nil {
		c.src = src
		c.held = &c.src
	}
	// The gateway's estimate: a token is about four bytes of prompt.
	c.blockTokens = (pol.PrefixBlockChars + 3) / 4
}

// split decides, for the chosen (decode) replica, whether the request's
// prefill runs elsewhere: when its uncached prompt tokens (the prompt less
// what the prefix knowledge says the decode replica holds) reach
// min_uncached_tokens and a prefill replica can take it. It never switches
// the decode replica and never refuses: without a prefill replica the
// request is served whole, so admission covers both legs.
func (p *pick) split() (bool, *subjects.APIError) {
	c := &p.pd
	c.prefill, c.uncached, c.why = nil, 0, ""
	if c.on == nil {
		return false, nil
	}
	x := p.cands[p.chosen].x
	c.uncached = p.req.PromptTokens
	if c.held != nil && len(p.req.Prefix) > 0 {
		c.uncached = max(c.uncached-c.held.heldBy(p.req.Prefix, x)*c.blockTokens, 0)
	}
	switch {
	case p.req.ResumeFrom != "":
		c.why = SplitWholeResume
	case p.req.Pin != "":
		c.why = SplitWholePinned
	case p.req.Endpoint != subjects.EndpointChat && p.req.Endpoint != subjects.EndpointCompletions:
		c.why = SplitWholeEndpoint
	case c.uncached < c.on.MinUncachedTokens:
		c.why = SplitWholeShort
	default:
		if c.prefill = p.prefillFor(x); c.prefill == nil {
			c.why = SplitWholeNoPrefill
		} else {
			c.why = SplitPrefill
		}
	}
	return false, nil
}

// prefillFor picks the prefill replica for decode replica x: among the
// model's prefill replicas of x's version that are live, in rotation, not
// excluded, serve the endpoint and are not at capacity, the one holding
// the longest chain of the prompt's blocks while below the release
// threshold, ties to the lowest load_score. With regions in force, only
// x's own region's: the two legs of a request are served in one region,
// so a resident tenant's prefill stays where its decode is.
func (p *pick) prefillFor(x *replica) *replica {
	c := &p.pd
	var best *replica
	bestHeld, bestLoad := -1, 0.0
	for _, y := range c.group {
		if !y.prefillOnly || y.reg.Version != x.reg.Version || !p.live(y) || p.nowNano < y.eject.until ||
			!p.serves(y) || slices.Contains(p.req.Exclude, y.id) || p.region.on && y.region != x.region {
			continue
		}
		cand := cand{x: y, fresh: max(p.nowNano-y.dataNano, 0) < p.stale}
		p.load(&cand, c.w)
		if cand.full {
			continue
		}
		if cand.saturated {
			cand.load += SaturationPenalty
		}
		held := 0
		if c.held != nil && len(p.req.Prefix) > 0 && y.kv < p.release {
			held = c.held.heldBy(p.req.Prefix, y)
		}
		if held > bestHeld || held == bestHeld && cand.load < bestLoad {
			best, bestHeld, bestLoad = y, held, cand.load
		}
	}
	return best
}

func (p *pick) whySplit(int) string { return "" }

func (p *pick) reportSplit(d *Decision) {
	c := &p.pd
	if c.on == nil {
		return
	}
	d.Split, d.UncachedTokens = c.why, c.uncached
	if c.prefill != nil {
		d.Prefill = c.prefill.id
	}
}
