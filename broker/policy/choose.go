package policy

import (
	"math"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// The replica-choice steps of the steps table, in its order, each with
// the method that says why a candidate lost when it decided.

// pinned keeps a Responses API conversation on the replica holding its
// stored turns: the pinned filter left it the only candidate.
func (p *pick) pinned() bool {
	if p.req.Pin == "" || len(p.cands) != 1 {
		return false
	}
	p.chosen = 0
	return true
}

// session keeps a conversation on its rendezvous-hash replica: the
// candidate with the highest mix(hash(conversation) ^ hash(replica id)).
// Adding or removing one of N replicas moves only ≈1/N of the
// conversations, unlike hash mod N.
func (p *pick) session() bool {
	if p.req.Conversation == "" {
		return false
	}
	hc := xxhash.Sum64String(p.req.Conversation)
	best, bestScore := -1, uint64(0)
	for i := range p.cands {
		if s := mix64(hc ^ p.cands[i].x.idHash); best < 0 || s > bestScore {
			best, bestScore = i, s
		}
	}
	if p.cands[best].x.kv < p.release {
		p.chosen = best
		return true
	}
	p.released, p.releasedWhy = best, WhyReleased
	return false
}

func (p *pick) whySession(int) string { return WhyNotAffine }

// mix64 is the splitmix64 finalizer: it spreads the xor of two hashes so
// the rendezvous scores of one conversation are independent per replica.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// loraStep is lora-affinity's state: whether it found the adapter
// loaded (else it chose by free slot).
type loraStep struct{ loaded bool }

// lora concentrates an adapter: the least loaded replica already running
// it; else the least loaded with a free adapter slot; else it leaves the
// choice to the next steps. Fewer distinct adapters per batch means less
// grouped-GEMM overhead, worth some imbalance.
func (p *pick) lora() bool {
	a := p.adapter
	if a == "" {
		return false
	}
	best := -1
	for i := range p.cands {
		c := &p.cands[i]
		if c.x.kv < p.release && hasAdapter(c.x, a) && (best < 0 || c.load < p.cands[best].load) {
			best = i
		}
	}
	p.adapters.loaded = best >= 0
	if best < 0 {
		for i := range p.cands {
			c := &p.cands[i]
			if c.x.kv < p.release && adapterRoom(c.x) && (best < 0 || c.load < p.cands[best].load) {
				best = i
			}
		}
	}
	if best < 0 {
		return false
	}
	p.chosen = best
	return true
}

// whyLora: the loser was above the release threshold, or lacked the
// adapter (or a slot for it) that decided.
func (p *pick) whyLora(i int) string {
	c := &p.cands[i]
	switch {
	case c.x.kv >= p.release:
		return WhyReleased
	case p.adapters.loaded && !hasAdapter(c.x, p.adapter):
		return WhyNoAdapter
	case !p.adapters.loaded && !adapterRoom(c.x):
		return WhyNoAdapterSlot
	}
	return p.prof.whyHigher
}

// hasAdapter: running or waiting in the engine, or sent there by this broker
// since the last heartbeat.
func hasAdapter(x *replica, a string) bool {
	return slices.Contains(x.hb.Lora.Running, a) || slices.Contains(x.hb.Lora.Waiting, a) ||
		slices.Contains(x.sent[:x.nsent], a)
}

// adapterRoom: fewer adapters running (counting those this broker just sent)
// than the replica's slots. Unknown slots (0) mean no LoRA support.
func adapterRoom(x *replica) bool {
	slots := firstPositive(x.hb.Lora.Max, x.reg.MaxLoras, 0)
	used := len(x.hb.Lora.Running)
	for _, a := range x.sent[:x.nsent] {
		if !slices.Contains(x.hb.Lora.Running, a) {
			used++
		}
	}
	return used < slots
}

// prefixStep is prefix-affinity's state: the blocks matched on the replica
// it chose, whether that match came from the exact index (kv-events), and
// the walk's scratch.
type prefixStep struct {
	matched int
	exact   bool
	// The walk over one level: the deepest holder whatever its kv (hot, at
	// hotLvl) and the usable holder it takes (best), below the release
	// threshold.
	hot, hotLvl, best int
	// Without predicted-ttft, best is the lighter of two of its level's
	// usable holders drawn at random (draw), and hot of two of the deepest
	// level's holders (hotDraw). Each keeps the two holders of highest
	// mix64(seed ^ replica id hash), seed drawn once per decision: a
	// uniformly random pair, at a hash per holder.
	seed          uint64
	draw, hotDraw drawTwo
}

// prefix picks a replica holding the longest chain of the request's prefix
// blocks among the usable holders, those below the release threshold.
// Chained hashes make presence monotone in the chain (a block is stored
// with every block before it), so a binary search finds the longest stored
// level in O(log n) lookups; the walk down from there only continues while
// that level's holders are not usable.
//
// Among a level's usable holders the lighter of two drawn at random wins
// (with predicted-ttft, the lowest prediction): the lowest kv_usage of all,
// read from heartbeats up to a second old, would be the same replica for
// every request until the next heartbeat. Without predicted-ttft the
// holder is then weighed against the lighter replica of the power-of-two
// pair (outweighed): it keeps the request unless that replica's load_score
// is lower by more than the cached prefix is worth. A prefix held
// everywhere (a shared system prompt) thus keeps requests on its holders
// only while they are about as light as any.
//
// Two sources say who holds a block: the exact index, for replicas whose
// adapter's KV-event feed is live (what their engines hold, evictions
// included), and the placement map, this broker's and its peers' guesses,
// for the others. A mixed fleet reads each replica from its own source.
//
// When no holder is usable, the deepest holder (hot; of that level's
// holders, the lighter of two drawn) is weighed the same way rather than
// dropped: near saturation every replica is above the threshold, and a
// plain release there only trades a cache hit for a miss, a longer
// prefill, and more load: the cascade the lab's prefix benchmark showed. When it gives way, the power-of-two step decides, with
// the same pair.
func (p *pick) prefix() bool {
	m := p.holders
	if (m == nil && p.kv == nil) || len(p.req.Prefix) == 0 || p.weighAll() {
		return false // predicted-ttft weighs the holders with every candidate
	}
	blocks := p.req.Prefix
	top := -1
	for lo, hi := 0, len(blocks); lo < hi; {
		mid := int(uint(lo+hi) >> 1)
		if (m != nil && m.find(blocks[mid]) >= 0) || (p.kv != nil && p.kv.Lookup(p.kvModel, blocks[mid]).Len() > 0) {
			top, lo = mid, mid+1
		} else {
			hi = mid
		}
	}
	w := &p.warm
	w.hot, w.hotLvl, w.hotDraw.n = -1, -1, 0
	if !p.prof.byTTFT {
		w.seed = p.rng.Uint64()
	}
	for lvl := top; lvl >= 0; lvl-- {
		w.best, w.draw.n = -1, 0
		if m != nil {
			if e := m.get(blocks[lvl]); e != nil {
				for _, x := range e.reps {
					if x != nil && x.mark == p.epoch && !x.kvLive {
						p.considerHolder(int(x.ci), lvl)
					}
				}
			}
		}
		if p.kv != nil {
			hs := p.kv.Lookup(p.kvModel, blocks[lvl])
			for i := range hs.Len() {
				if id := int(hs.At(i)); id < len(p.byKV) {
					if x := p.byKV[id]; x != nil && x.mark == p.epoch && x.kvLive {
						p.considerHolder(int(x.ci), lvl)
					}
				}
			}
		}
		if !p.prof.byTTFT && w.draw.n > 0 {
			w.best = p.lighter(&w.draw)
		}
		if w.best >= 0 {
			p.credit(w.best, lvl+1)
			if p.queuedOut(w.best) {
				return false // predicted-ttft decides; the holder loses on its prediction
			}
			if !p.prof.byTTFT {
				if why := p.outweighed(w.best, lvl+1); why != "" {
					p.released, p.releasedWhy = w.best, why
					return false // power of two decides, with the same pair
				}
			}
			p.chosen, w.matched, w.exact = w.best, lvl+1, p.cands[w.best].x.kvLive
			return true
		}
	}
	if w.hot >= 0 && !p.prof.byTTFT {
		w.hot = p.lighter(&w.hotDraw)
	}
	// Weighing needs fresh load data and a choice: otherwise the next
	// steps decide, as they would have.
	hot, hotLvl := w.hot, w.hotLvl
	if hot < 0 || len(p.cands) == 1 || p.nfresh == 0 {
		return false
	}
	why := p.outweighed(hot, hotLvl+1)
	if h := &p.cands[hot]; why == "" {
		p.chosen, w.matched, w.exact = hot, hotLvl+1, h.x.kvLive
		p.credit(hot, hotLvl+1)
		return true
	}
	p.released, p.releasedWhy = hot, WhyReleased
	if why == WhyMoreWork {
		p.releasedWhy = why
	}
	return false
}

// outweighed says why the warm candidate ci, holding matched of the
// request's prefix blocks, gives way to the lighter replica of the
// power-of-two pair ("" when it keeps the request): WhyOutweighed when that
// replica's load_score is lower by more than the cached prefix is worth
// (prefixWorth × the matched share of the prefix), WhyMoreWork when ci is
// named by the exact index and has more prefill work (outworked). Weighing
// needs fresh load data and a choice; without them ci keeps the request.
func (p *pick) outweighed(ci, matched int) string {
	if len(p.cands) == 1 || p.nfresh == 0 {
		return ""
	}
	lighter := p.twoOf()[0]
	if lighter == ci {
		return ""
	}
	h, a := &p.cands[ci], &p.cands[lighter]
	switch {
	case a.load+prefixWorth*float64(matched)/float64(len(p.req.Prefix)) < h.load:
		return WhyOutweighed
	case h.x.kvLive && p.outworked(ci, lighter, matched):
		return WhyMoreWork
	}
	return ""
}

// outworked reports whether the warm candidate h, holding matched of the
// request's prefix blocks, has more prefill work ahead of the request's
// first token (the prompt tokens queued and sent there, and the request's
// uncached ones: work, its matched blocks credited) than candidate a by
// more than prefixWorkMargin times the request's prompt. load_score counts a queue by
// its requests, not its tokens: a warm replica queueing long prompts keeps
// its requests by load_score alone until they wait for seconds (Mooncake's
// conversation slice in the lab's trace replay, docs/lab/report.md,
// section 12). Only a holder the exact index names is weighed so: releasing
// a placements holder, a guess, loses the prefix benchmark's cache hits at
// its top steps (section 8).
func (p *pick) outworked(h, a, matched int) bool {
	prompt := float64(max(p.req.PromptTokens, int(p.blockTokens)))
	hw := p.cands[h].x.inFlightTokens() + max(prompt-float64(matched)*float64(p.blockTokens), 0)
	return hw-p.work(a) > prefixWorkMargin*prompt
}

// prefixWorkMargin is how much more prefill work, in prompts of the
// request, a warm replica the exact index names may have than the
// power-of-two pair's lighter replica before it gives the request up
// (outworked). At 1 the prefix benchmark's arm with KV events reached 1.8×
// and 6.6× the oracle's p90 at its top two steps; at 4 and 16 Mooncake's
// conversation slice stayed above power of two's at half the pool's
// capacity.
const prefixWorkMargin = 2.0

// queuedOut reports whether, with policy.replica_choice predicted-ttft,
// the warm replica ci (its held blocks credited) loses to a replica of the
// power-of-two pair by betterTTFT: predicted TTFT plus the prefill each
// holds up there, costs within predictedTie of each other going by
// load_score, as everywhere in predicted-ttft. The predicted-ttft step then
// decides among the holders and the pair, which is how the lab's oracle
// places near saturation: the warm replica keeps a request while its queue
// costs clearly less than the prefill its cache saves, and a lighter
// replica takes it when the two are close: releasing only on a clear
// difference keeps more hits but lets queues grow near saturation. Only a
// holder the exact index (kv-events) names is weighed so: a holder named
// by placements, a guess, keeps the request, since weighing those too
// loses cache hits at every load (docs/lab/report.md, section 8, has the
// figures of both). A pair replica without a learned prefill rate is not
// weighed: it would look free.
func (p *pick) queuedOut(ci int) bool {
	if !p.prof.byTTFT || !p.cands[ci].x.kvLive || p.nfresh == 0 || len(p.cands) == 1 {
		return false
	}
	for _, i := range p.twoOf() {
		if i != ci && p.cands[i].x.msPerToken > 0 && p.betterTTFT(i, ci) {
			return true
		}
	}
	return false
}

// considerHolder weighs candidate ci, a holder of the prefix's block lvl,
// in the walk.
func (p *pick) considerHolder(ci, lvl int) {
	w, c := &p.warm, &p.cands[ci]
	if c.held == 0 {
		c.held = int32(lvl + 1) // the walk goes down: the first level is the deepest
	}
	if p.prof.byTTFT {
		p.holderByTTFT(ci, lvl)
		return
	}
	if w.hot < 0 {
		w.hot, w.hotLvl = ci, lvl
	}
	pri := mix64(w.seed ^ c.x.idHash)
	if lvl == w.hotLvl {
		w.hotDraw.offer(ci, pri)
	}
	if c.x.kv < p.release {
		w.draw.offer(ci, pri)
	}
}

// drawTwo keeps the two candidates of highest priority among those
// offered (n), the higher first.
type drawTwo struct {
	n   int
	idx [2]int
	pri [2]uint64
}

func (d *drawTwo) offer(ci int, pri uint64) {
	switch d.n++; {
	case d.n == 1:
		d.idx[0], d.pri[0] = ci, pri
		return
	case d.n == 2 || pri > d.pri[1]:
		d.idx[1], d.pri[1] = ci, pri
	default:
		return
	}
	if d.pri[1] > d.pri[0] {
		d.idx[0], d.idx[1] = d.idx[1], d.idx[0]
		d.pri[0], d.pri[1] = d.pri[1], d.pri[0]
	}
}

// lighter is the lighter of the two drawn (n offered; the only one when
// one was), ties at random: the lowest kv of all, read from heartbeats up
// to a second old, would be the same replica for every decision until its
// next heartbeat.
func (p *pick) lighter(d *drawTwo) int {
	if d.n < 2 {
		return d.idx[0]
	}
	a, b := d.idx[0], d.idx[1]
	if lb, la := p.cands[b].load, p.cands[a].load; lb < la || lb == la && p.rng.IntN(2) == 0 {
		return b
	}
	return a
}

// holderByTTFT is considerHolder with policy.replica_choice predicted-ttft:
// among the holders of one level, the one with the lowest predicted TTFT
// (its held blocks cached) wins instead of the lighter of two drawn. A
// prefix held by two replicas then splits its requests by their queues,
// where kv_usage, full of cached blocks on both, says little.
func (p *pick) holderByTTFT(ci, lvl int) {
	w := &p.warm
	p.credit(ci, lvl+1)
	if w.hot < 0 {
		w.hot, w.hotLvl = ci, lvl
	} else if w.hotLvl == lvl && p.betterTTFT(ci, w.hot) {
		w.hot = ci
	}
	if p.cands[ci].x.kv < p.release && (w.best < 0 || p.betterTTFT(ci, w.best)) {
		w.best = ci
	}
}

// prefixWorth is what a fully matched prefix is worth in load_score: as
// much as the saturation penalty, so a saturated warm replica keeps a
// request whose whole prefix it holds unless the drawn alternative is
// lighter even without the penalty. A partial match is worth its share.
const prefixWorth = 1.0

func (p *pick) whyPrefix(i int) string {
	w, c := &p.warm, &p.cands[i]
	switch {
	case c.x.kv >= p.release:
		return WhyReleased
	case p.prof.byTTFT || int(c.held) != w.matched || w.draw.n < 2:
		return WhyShorterPrefix
	case i == w.draw.idx[0] || i == w.draw.idx[1]:
		return p.prof.whyHigher // drawn with the chosen one, and heavier
	}
	return WhyNotDrawnHolder
}

func (p *pick) reportPrefix(d *Decision) {
	d.PrefixMatched = p.warm.matched
	d.PrefixSource = PrefixPlacements
	if p.warm.exact {
		d.PrefixSource = PrefixKVEvents
	}
}

// only takes the one candidate: nothing to choose.
func (p *pick) only() bool {
	if len(p.cands) != 1 {
		return false
	}
	p.chosen = 0
	return true
}

// staleRandom picks at random when no candidate's load data is fresher than
// stale_after: stale data is worse than random.
func (p *pick) staleRandom() bool {
	if p.nfresh != 0 {
		return false
	}
	p.chosen = p.rng.IntN(len(p.cands))
	return true
}

func (p *pick) whyStaleRandom(int) string { return WhyNotDrawn }

// powerOfTwo is the power of two choices: two random candidates, the lower
// load_score wins. Sampling two instead of taking the global minimum keeps
// brokers with the same stale view from herding onto one replica. It always
// decides (the steps before it leave at least two candidates).
func (p *pick) powerOfTwo() bool {
	p.chosen = p.twoOf()[0]
	return true
}

func (p *pick) whyPowerOfTwo(i int) string {
	if i != p.pair.ij[1] {
		return WhyNotSampled
	}
	return ""
}

// alternatives records the (at most 3) lowest-scored candidates that
// lost, why, and their scorers' values.
func (p *pick) alternatives(d *Decision) {
	var top [3]int
	n := 0
	worst := math.Inf(1) // the load of top[n-1] once top is full
	for i := range p.cands {
		l := p.cands[i].load
		if l >= worst || i == p.chosen {
			continue
		}
		k := min(n, len(top)-1)
		for k > 0 && p.cands[top[k-1]].load > l {
			top[k] = top[k-1]
			k--
		}
		top[k] = i
		n = min(n+1, len(top))
		if n == len(top) {
			worst = p.cands[top[n-1]].load
		}
	}
	for k := 0; k < n; k++ {
		c := &p.cands[top[k]]
		a := &d.Alts[k] // field by field: see candidates
		a.Replica, a.Score, a.Why, a.PredictedTTFTMillis = c.x.id, c.load, p.why(top[k]), c.ttft
		if a.NoTTFTEvidence = !c.x.ttftKnown(); a.NoTTFTEvidence {
			a.PredictedTTFTMillis = 0
		}
		d.AltValues[k] = p.valuesOf(top[k])
	}
	d.NAlts = n
}
