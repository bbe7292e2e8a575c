package policy

import (
	"math"

	"github.com/switchyard-llm/switchyard/table"
)

// Limits assumed when neither the heartbeat nor the table gives one.
const (
	DefaultMaxBatch = 256 // vLLM's default max_num_seqs
	DefaultMaxQueue = 256
	// SaturationPenalty is the default profile's weight of the saturated
	// scorer: a saturated replica's score is its load_score plus it, so it
	// sorts after every unsaturated one but stays a candidate, because
	// excluding saturated replicas cascades the load onto the others.
	SaturationPenalty = 1.0
)

// cand is one candidate of the current decision with its load view.
type cand struct {
	x         *replica
	load      float64 // the score: the profile's weighted scorers (switchyard: load_score, saturation penalty included)
	ttft      float64 // predicted milliseconds to the first token (predict)
	uncached  int32   // the request's prompt tokens the replica is not known to hold
	fresh     bool    // load data younger than stale_after
	saturated bool
	full      bool // at capacity: see load
	// slotsAhead is the requests that wait for a batch slot there, this
	// one included (0: its batch has room; more: it is full).
	slotsAhead int32
	// held is the prefix blocks prefix affinity's walk, or matchAll, found
	// it holding (0: not a holder, or not walked).
	held int32
}

// candidates makes the candidates of (model, version, pool): the
// registered replicas of the group (they come from the table index) that
// every filter in force keeps. It reports whether there is at least one.
func (st *decision) candidates(model, version, pool string) bool {
	r, p := st.r, &st.pick
	r.view.epoch++
	list := r.view.groups[groupKey{model, version, pool}]
	pol := &st.snap.Policy
	p.epoch = r.view.epoch
	p.release, p.saturation = st.snap.PoolOverrides(pool)
	// A lagging router's silence from every replica is its own, not
	// theirs (deafness): a stalled observer keeps its replicas.
	p.deaf = r.deafness(p.nowNano)
	p.dead, p.stale = int64(pol.DeadAfter)+p.deaf, int64(pol.StaleAfter)
	if p.panicked = p.panics(list, st.snap.PanicBelow(pool)); p.panicked {
		p.dead = math.MaxInt64 // live keeps every ready replica, heard or not
	}
	p.prof = r.profiles.of(pool)
	p.blockTokens = int32(pol.PrefixBlockChars / 4) // prompt tokens are estimated as bytes ÷ 4
	p.nfresh, p.nfull = 0, 0
	// The profile's filters in force: those with flags as one mask, the
	// others to call for each replica the mask keeps.
	var inForce, calls [len(filters)]*filter
	n, nc := 0, 0
	var fmask, fwant uint16
	heard := false
	for _, f := range p.prof.filters {
		if f.on == nil || f.on(p, list) {
			inForce[n] = f
			n++
			if f.flags != nil {
				m, w := f.flags(p)
				fmask, fwant, heard = fmask|m, fwant|w, heard || f.heard
			} else {
				calls[nc] = f
				nc++
			}
		}
		if f.report != nil {
			f.report(p, st.d)
		}
	}
	if cap(st.cands) < len(list) {
		st.cands = make([]cand, 0, 2*len(list)) // once per group size: decisions stay allocation-free
	}
	cands := st.cands[:len(list)]
	k := 0
	w := &pol.LoadWeights
	uncached := clamp32(p.req.PromptTokens)
	local, nlocal, localRoom := p.region.local(), 0, false
next:
	for _, x := range list {
		// The filters with flags at once, one mask test per candidate: a
		// call through each row's function value costs far more
		// (docs/benchmarks.md, "Micro-benchmarks").
		if x.flags&fmask != fwant || heard && max(p.nowNano-x.hbNano, 0) >= p.dead {
			for _, f := range inForce[:n] {
				if !f.keep(p, x) {
					break // what the rows before it kept and it left out, it counted
				}
			}
			continue
		}
		for _, f := range calls[:nc] {
			if !f.keep(p, x) {
				continue next
			}
		}
		// The load view, computed again only when stale; the result is
		// load's.
		v := &x.scored
		if v.ver != x.ver || v.prof != p.prof || v.sat != p.saturation {
			p.renew(x, w)
		}
		// Field by field, every field: a composite literal is built on the
		// stack and copied with wide loads that wait on its narrow stores
		// (docs/benchmarks.md, "Profiles side by side").
		c := &cands[k]
		c.x, c.load, c.uncached = x, v.load, uncached
		c.fresh = max(p.nowNano-x.dataNano, 0) < p.stale
		c.saturated, c.slotsAhead, c.held = v.saturated, v.slotsAhead, 0
		c.full = c.fresh && v.capacity
		c.ttft = max(v.before+float64(uncached)*v.perToken, v.floor)
		if c.fresh {
			p.nfresh++
		}
		if c.full {
			p.nfull++
		}
		if x.region == local {
			// The region step's count, here where x is at hand.
			nlocal++
			localRoom = localRoom || !c.saturated
		}
		x.mark, x.ci = p.epoch, int32(k)
		k++
	}
	p.region.nlocal, p.region.localRoom = nlocal, localRoom
	cands = p.preferNotAvoided(p.regional(cands[:k]))
	st.cands, p.cands = cands, cands
	return len(cands) > 0
}

// scoredView is what load and the profile's scorers compute from a
// replica's own state alone, kept on the replica until that state (ver),
// the profile (built with each table) or the pool's saturation threshold
// changes: between two of those, every decision that lists the replica as
// a candidate would compute the same, and most decisions change only the
// one replica they choose.
type scoredView struct {
	prof *profile
	ver  uint64
	sat  float64
	// load is the score: the sum of the profile's weighted scorers'
	// values (values, below).
	load float64
	// The prediction of a request with u uncached prompt tokens is
	// max(before + u·perToken, floor) (predictAfter, with what does not
	// depend on the request worked out once).
	before, perToken, floor float64
	saturated               bool
	capacity                bool // full, if its load data is fresh
	slotsAhead              int32

	// Read for the chosen replica and the alternatives only: each
	// scorer's value (the profile's order), and load_score.
	values [table.MaxScorers]float64
	score  float64
}

// renew computes x's load view again: what load and the profile's
// scorers compute for x alone.
func (p *pick) renew(x *replica, w *table.LoadWeights) {
	c := cand{x: x, fresh: true}
	p.load(&c, w)
	x.scored = scoredView{prof: p.prof, ver: x.ver, sat: p.saturation, score: c.load,
		saturated: c.saturated, capacity: c.full, slotsAhead: c.slotsAhead}
	v := &x.scored
	v.before, v.perToken, v.floor = x.predictParts(c.slotsAhead)
	total := 0.0
	for k, sc := range p.prof.scorers {
		v.values[k] = sc.value(x, v)
		total += p.prof.weights[k] * v.values[k]
	}
	v.load = total
}

// load computes a candidate's load_score (policy.load_weights in
// docs/protocol.md), without the saturation penalty (the saturated
// scorer's):
//
//	w.kv·kv_usage + w.queue·waiting/max_queue + w.batch·running/max_batch
//
// The adapter's load delta since the heartbeat (requests started less
// requests ended) and this broker's in-flight requests since the delta
// count as if the engine had admitted or finished them: a request in, into
// the batch while it has room, then into the queue; a request out, from
// the queue first. So one in-flight request weighs w.batch/max_batch (or
// w.queue/max_queue once the batch is full), which is what it will weigh
// in the next heartbeat. A replica is saturated when its reported kv ≥
// saturation_kv or its reported queue is full, and at capacity ("full")
// when its reported queue is full and it cannot drain it (batch full or kv
// saturated); stale load data is never full, since it cannot tell. An
// unknown max_queue counts as DefaultMaxQueue in the score and never fills.
func (p *pick) load(c *cand, w *table.LoadWeights) {
	x := c.x
	running, waiting, maxBatch := x.running, x.waiting, x.maxBatch
	switch n := x.inflight + x.delta; {
	case n > 0:
		add := min(max(maxBatch-running, 0), n)
		running += add
		waiting += n - add
	case n < 0:
		// Requests ended since the heartbeat: the queue drains first.
		take := min(waiting, -n)
		waiting -= take
		running = max(running+n+take, 0)
	}
	c.load = w.KV*x.kv + w.Queue*float64(waiting)*x.perQueue + w.Batch*float64(running)*x.perBatch
	// Saturation and capacity come from what the replica reported, not
	// from this broker's in-flight count: that count only resets at the next
	// heartbeat (the broker never sees a request end), so at a high request
	// rate it would call an idle replica full. It steers the score only; the
	// engine keeps the final say on admission.
	queueFull := x.maxQueue > 0 && x.waiting >= x.maxQueue
	c.saturated = x.kv >= p.saturation || queueFull
	c.full = c.fresh && queueFull && (x.running >= maxBatch || x.kv >= p.saturation)
	// At an engine scheduling by priority the batch lines waiting come
	// after the request (the prediction is an interactive request's: a
	// batch line is placed by batch-room, not by its prediction).
	c.slotsAhead = max(running+waiting-min(waiting, x.batchWaiting)+1-maxBatch, 0)
}

// predict is the time to first token, in ms, of a request with uncached
// prompt tokens on x: the prefill work queued ahead of it (what the
// heartbeat or the load delta on top of it reported queued, plus what was
// sent since) and its own uncached tokens, at x's prefill rate, after x's
// base TTFT. When x's batch has no room for it, slotsAhead requests
// (itself included) wait for a running one to end first: with a full
// batch a slot frees every decode time / max_batch (slotMs, from the
// heartbeat's decode_ms), as a running request holds its slot for its
// whole decode. Without a decode time that wait is unknown: the
// prediction is then at least the replica's recent wait estimate (the
// larger of its TTFT and queue-wait EWMAs), what its latest requests
// waited. Without a learned prefill rate it is that estimate.
func (x *replica) predict(uncached, slotsAhead int32) float64 {
	before, perToken, floor := x.predictParts(slotsAhead)
	return max(before+float64(uncached)*perToken, floor)
}

// predictParts is predict with what does not depend on the request's
// uncached tokens worked out: the prediction of u uncached tokens is
// max(before + u·perToken, floor). The load view keeps them (renew).
func (x *replica) predictParts(slotsAhead int32) (before, perToken, floor float64) {
	switch ahead := x.ahead(); {
	case x.msPerToken <= 0:
		return x.wait, 0, 0
	case slotsAhead <= 0:
		return ahead, x.msPerToken, 0
	case x.slotMs > 0:
		return ahead + float64(slotsAhead)*x.slotMs, x.msPerToken, 0
	default:
		return ahead, x.msPerToken, x.wait
	}
}

// ahead is x's base TTFT plus the prefill work queued there, in ms.
func (x *replica) ahead() float64 {
	return x.baseTTFT + float64(int64(x.queuedPrefill)+int64(x.sentPrefill))*x.msPerToken
}

// prefillCost is the time, in ms, that a prefill of uncached tokens on x
// holds up the requests queued and running there: the whole batch waits
// for it (0 without a learned rate).
func (x *replica) prefillCost(uncached int32) float64 {
	return float64(uncached) * x.msPerToken
}

func firstPositive(a, b, c int) int {
	switch {
	case a > 0:
		return a
	case b > 0:
		return b
	}
	return c
}
