package policy

import (
	"github.com/cespare/xxhash/v2"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// place picks the version and the pool for res: the first pool rule that
// matches, in order. The canary version is drawn at the canary rule's place,
// so long-context, premium and batch traffic always gets the stable version.
// The stable target is the one with the highest weight (the first on a tie);
// every other target is a canary. A table without a canary rule still splits
// traffic by weight, in the general pool.
func (res *resolution) place(to *resolved) {
	res.poolFallback, res.canaryGone = false, false
	var targets []table.Target
	if to.alias != nil {
		targets = to.alias.Targets
	}
	res.stable = table.Target{Model: to.model, Weight: 1}
	for i, t := range targets {
		if i == 0 || t.Weight > res.stable.Weight {
			res.stable = t
		}
	}
	res.target, res.pool = res.stable, ""
	canaryRule := false
	pol := &res.snap.Policy
	for _, rule := range pol.PoolRules {
		match := false
		switch rule.When {
		case table.WhenLongContext:
			match = res.req.PromptTokens > pol.LongContextTokens
		case table.WhenPremium:
			match = res.tier == table.TierPremium
		case table.WhenBatch:
			match = res.req.Priority == subjects.PriorityBatch
		case table.WhenCanary:
			canaryRule = true
			if t, ok := res.draw(to.aliasName, targets); ok {
				res.target, match = t, true
			}
		case table.WhenAlways:
			match = true
		}
		if match {
			res.pool = rule.Pool
			return
		}
	}
	res.pool = table.PoolGeneral
	if !canaryRule {
		if t, ok := res.draw(to.aliasName, targets); ok {
			res.target = t
		}
	}
}

// draw picks a target by weight, sticky per conversation (a hash of alias
// and conversation, so one conversation is not the canary of every alias at
// once), random without one. ok is false when the stable target was drawn.
func (res *resolution) draw(alias string, targets []table.Target) (t table.Target, ok bool) {
	total := 0
	for _, t := range targets {
		total += t.Weight
	}
	if len(targets) < 2 || total <= 0 {
		return t, false
	}
	var x int
	if c := res.req.Conversation; c != "" {
		var h xxhash.Digest
		h.Reset()
		_, _ = h.WriteString(alias)
		_, _ = h.Write([]byte{0})
		_, _ = h.WriteString(c)
		x = int(h.Sum64() % uint64(total))
	} else {
		x = res.rng.IntN(total)
	}
	for _, t := range targets {
		if x -= t.Weight; x < 0 {
			return t, t != res.stable
		}
	}
	return t, false
}

// gather collects the candidates of the target in its pool. A pool without
// a candidate for the model falls back to general; a drawn canary without
// one falls back to the stable version in the general pool.
func (st *decision) gather() bool {
	if st.req.Pin != "" {
		return st.gatherPinned()
	}
	t := &st.res.target
	if st.candidates(t.Model, t.Version, st.res.pool) {
		return true
	}
	if st.res.pool != table.PoolGeneral && st.candidates(t.Model, t.Version, table.PoolGeneral) {
		st.res.pool, st.res.poolFallback = table.PoolGeneral, true
		return true
	}
	if *t != st.res.stable {
		st.res.target, st.res.pool, st.res.canaryGone = st.res.stable, table.PoolGeneral, true
		return st.candidates(st.res.stable.Model, st.res.stable.Version, table.PoolGeneral)
	}
	return false
}

// gatherPinned makes the pinned replica the only candidate, in its own pool
// and version: a stored conversation lives on one replica, so no pool rule,
// canary draw or fallback may move it.
func (st *decision) gatherPinned() bool {
	x := st.r.view.replicas[st.req.Pin]
	if x == nil || x.reg == nil || x.reg.Model != st.res.target.Model {
		st.pinLost = true
		return false
	}
	st.res.target.Version, st.res.pool = x.reg.Version, x.reg.Pool
	if !st.candidates(x.reg.Model, x.reg.Version, x.reg.Pool) {
		st.pinLost = true
		return false
	}
	return true
}

// fallbacks follows the fallbacks of the resolved alias, then those of the
// cascade aliases that led to it, breadth first and loop-safe, until one
// leads to a candidate. An explicit "model:adapter" never falls back: the
// adapter belongs to its model.
func (st *decision) fallbacks(found *resolved) bool {
	if st.res.explicit {
		return false
	}
	var q fallbackQueue
	if found.alias != nil {
		q.push(found.alias.Fallbacks)
	}
	for i := st.res.npath - 2; i >= 0; i-- {
		if a := st.snap.Aliases[st.res.path[i]]; a != nil {
			q.push(a.Fallbacks)
		}
	}
	for q.head < q.n {
		name := q.names[q.head]
		q.head++
		from := st.res.npath
		var fb resolved
		if st.res.resolve(name, &fb) != nil {
			continue
		}
		st.res.place(&fb)
		if overContext(st.snap.Models[st.res.target.Model], st.req) {
			continue
		}
		st.res.adapter = st.res.tenantAdapter(from)
		if st.gather() {
			st.res.fallback = name
			return true
		}
		st.noteCold()
		if fb.alias != nil {
			q.push(fb.alias.Fallbacks)
		}
	}
	return false
}

type fallbackQueue struct {
	names   [maxHops]string
	n, head int
}

func (q *fallbackQueue) push(names []string) {
	for _, n := range names {
		dup := false
		for _, m := range q.names[:q.n] {
			dup = dup || m == n
		}
		if !dup && q.n < maxHops {
			q.names[q.n] = n
			q.n++
		}
	}
}

// noteCold asks for a load when the target's model is cold-tier and has no
// ready replica (the first such model of the decision).
func (st *decision) noteCold() {
	m := st.snap.Models[st.res.target.Model]
	if st.d.ControlLoad || m == nil || m.Tier != table.TierCold {
		return
	}
	st.d.ControlLoad = true
	st.d.LoadModel, st.d.LoadVersion = st.res.target.Model, st.res.target.Version
}

// loading reports whether a registered replica of model is loading: the
// model is on its way, which a client should hear as model_loading.
func (st *decision) loading(model string) bool {
	for _, x := range st.r.view.byModel[model] {
		if x.reg != nil && subjects.Restrictive(x.reg.State, x.hb.State) == subjects.StateLoading {
			return true
		}
	}
	return false
}
