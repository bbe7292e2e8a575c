package policy

import (
	"slices"

	"github.com/cespare/xxhash/v2"

	"github.com/switchyard-llm/switchyard/subjects"
)

// pinned keeps a Responses API conversation on the replica holding its
// stored turns: gather left it the only candidate.
func (st *decision) pinned() bool {
	if st.req.Pin == "" || len(st.cands) != 1 {
		return false
	}
	st.chosen = 0
	return true
}

// session keeps a conversation on its rendezvous-hash replica: the
// candidate with the highest mix(hash(conversation) ^ hash(replica id)).
// Adding or removing one of N replicas moves only ≈1/N of the
// conversations, unlike hash mod N.
func (st *decision) session() bool {
	if st.req.Conversation == "" {
		return false
	}
	hc := xxhash.Sum64String(st.req.Conversation)
	best, bestScore := -1, uint64(0)
	for i := range st.cands {
		if s := mix64(hc ^ st.cands[i].x.idHash); best < 0 || s > bestScore {
			best, bestScore = i, s
		}
	}
	if st.cands[best].kv < st.release {
		st.chosen = best
		return true
	}
	st.released = best
	return false
}

// mix64 is the splitmix64 finalizer: it spreads the xor of two hashes so
// the rendezvous scores of one conversation are independent per replica.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// lora concentrates an adapter: the least loaded replica already running
// it; else the least loaded with a free adapter slot; else it leaves the
// choice to the next steps. Fewer distinct adapters per batch means less
// grouped-GEMM overhead, worth some imbalance.
func (st *decision) lora() bool {
	a := st.adapter
	if a == "" {
		return false
	}
	best := -1
	for i := range st.cands {
		c := &st.cands[i]
		if c.kv < st.release && hasAdapter(c.x, a) && (best < 0 || c.load < st.cands[best].load) {
			best = i
		}
	}
	st.loraLoaded = best >= 0
	if best < 0 {
		for i := range st.cands {
			c := &st.cands[i]
			if c.kv < st.release && adapterRoom(c.x) && (best < 0 || c.load < st.cands[best].load) {
				best = i
			}
		}
	}
	if best < 0 {
		return false
	}
	st.chosen = best
	return true
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

// prefix picks the replica holding the longest chain of the request's prefix
// blocks, among candidates below the release threshold; ties go to the
// lowest kv_usage. Chained hashes make presence monotone in the chain (a
// block is stored with every block before it), so a binary search finds the
// longest stored level in O(log n) lookups; the walk down from there only
// continues while that level's replicas are not usable.
//
// When every holder is above the threshold, releasing only helps if it finds
// a lighter replica: the power-of-two pair is drawn, and the request leaves
// its warm cache for the pair's winner only if that one's load_score is
// lower by more than the cached prefix is worth (prefixWorth × the matched
// share of the prefix); the power-of-two step then decides with the same
// pair. Near saturation every replica is above the threshold, and a plain
// release there only trades a cache hit for a miss, a longer prefill, and
// more load: the cascade the lab's prefix benchmark showed.
func (st *decision) prefix() bool {
	if len(st.req.Prefix) == 0 {
		return false
	}
	m := st.r.prefixes[st.target.Model]
	if m == nil {
		return false
	}
	blocks := st.req.Prefix
	top := -1
	for lo, hi := 0, len(blocks); lo < hi; {
		mid := int(uint(lo+hi) >> 1)
		if m.find(blocks[mid]) >= 0 {
			top, lo = mid, mid+1
		} else {
			hi = mid
		}
	}
	hot, hotLvl := -1, -1 // the deepest holder, whatever its kv
	for lvl := top; lvl >= 0; lvl-- {
		e := m.get(blocks[lvl])
		if e == nil {
			continue
		}
		best := -1
		for _, x := range e.reps {
			if x == nil || x.mark != st.r.epoch {
				continue
			}
			ci := int(x.ci)
			c := &st.cands[ci]
			if hot < 0 {
				hot, hotLvl = ci, lvl
			} else if hotLvl == lvl && c.kv < st.cands[hot].kv {
				hot = ci
			}
			if c.kv < st.release && (best < 0 || c.kv < st.cands[best].kv) {
				best = ci
			}
		}
		if best >= 0 {
			st.chosen, st.d.PrefixMatched = best, lvl+1
			return true
		}
	}
	// Weighing needs fresh load data and a choice: otherwise the next
	// steps decide, as they would have.
	if hot < 0 || len(st.cands) == 1 || st.nfresh == 0 {
		return false
	}
	st.drawTwo()
	h, a := &st.cands[hot], &st.cands[st.pair[0]]
	if st.pair[0] == hot || a.load+prefixWorth*float64(hotLvl+1)/float64(len(blocks)) >= h.load {
		st.drawn = false
		st.chosen, st.d.PrefixMatched = hot, hotLvl+1
		return true
	}
	st.released = hot
	return false
}

// prefixWorth is what a fully matched prefix is worth in load_score: as
// much as the saturation penalty, so a saturated warm replica keeps a
// request whose whole prefix it holds unless the drawn alternative is
// lighter even without the penalty. A partial match is worth its share.
const prefixWorth = 1.0

// only takes the one candidate: nothing to choose.
func (st *decision) only() bool {
	if len(st.cands) != 1 {
		return false
	}
	st.chosen = 0
	return true
}

// staleRandom picks at random when no candidate's load data is fresher than
// stale_after: stale data is worse than random.
func (st *decision) staleRandom() bool {
	if st.nfresh != 0 {
		return false
	}
	st.chosen = st.rng.IntN(len(st.cands))
	return true
}

// powerOfTwo is the power of two choices: two random candidates, the lower
// load_score wins. Sampling two instead of taking the global minimum keeps
// brokers with the same stale view from herding onto one replica. It always
// decides (the steps before it leave at least two candidates), with the
// pair the prefix step drew when it weighed a warm replica against it.
func (st *decision) powerOfTwo() bool {
	if !st.drawn {
		st.drawTwo()
	}
	st.chosen, st.other = st.pair[0], st.pair[1]
	return true
}

// drawTwo draws two distinct candidates into st.pair, the lower load_score
// first.
func (st *decision) drawTwo() {
	n := len(st.cands)
	i, j := st.rng.IntN(n), st.rng.IntN(n-1)
	if j >= i {
		j++
	}
	if st.cands[j].load < st.cands[i].load {
		i, j = j, i
	}
	st.pair, st.drawn = [2]int{i, j}, true
}

// alternatives records the (at most 3) lowest-load candidates that lost,
// and why.
func (st *decision) alternatives() {
	var top [3]int
	n := 0
	for i := range st.cands {
		if i == st.chosen {
			continue
		}
		l := st.cands[i].load
		if n == len(top) && l >= st.cands[top[n-1]].load {
			continue
		}
		k := min(n, len(top)-1)
		for k > 0 && st.cands[top[k-1]].load > l {
			top[k] = top[k-1]
			k--
		}
		top[k] = i
		n = min(n+1, len(top))
	}
	d := st.d
	for k := 0; k < n; k++ {
		c := &st.cands[top[k]]
		d.Alts[k] = subjects.Alternative{Replica: c.x.id, Score: c.load, Why: st.why(top[k])}
	}
	d.NAlts = n
}

// whyLora: the loser was above the release threshold, or lacked the
// adapter (or a slot for it) that decided.
func (st *decision) whyLora(i int) string {
	c := &st.cands[i]
	switch {
	case c.kv >= st.release:
		return WhyReleased
	case st.loraLoaded && !hasAdapter(c.x, st.adapter):
		return WhyNoAdapter
	case !st.loraLoaded && !adapterRoom(c.x):
		return WhyNoAdapterSlot
	}
	return WhyHigherLoad
}

func (st *decision) whyPrefix(i int) string {
	if st.cands[i].kv >= st.release {
		return WhyReleased
	}
	return WhyShorterPrefix
}

func (st *decision) whyPowerOfTwo(i int) string {
	if i != st.other {
		return WhyNotSampled
	}
	return ""
}
