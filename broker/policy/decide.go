package policy

import (
	"math/rand/v2"
	"time"

	"github.com/switchyard-llm/switchyard/broker/policy/kvindex"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// decision is the working state of one decision: Router.st, under
// Router.mu. It ties the two halves of a decision together: res, what the
// request resolves to (tenant, model, version, pool, adapter), and pick,
// the replica choice over the candidates of that group.
type decision struct {
	r      *Router
	req    *Request
	now    time.Time
	rng    *rand.Rand
	d      *Decision // &out
	commit bool
	snap   *table.Snapshot

	// out is the decision made; cands the candidates' scratch, kept from
	// one decision to the next so that a decision does not allocate.
	out   Decision
	cands []cand

	res   resolution
	pick  pick
	quota quotaCheck // the tenant's buckets as checkQuota read them
	// pinLost: the pinned replica cannot serve (gone, draining, another
	// model), and nothing else may.
	pinLost bool
}

// start readies st, as finish left it (or new: zero but for the
// candidates' scratch), for a decision of req.
func (st *decision) start(r *Router, req *Request, now time.Time, rng *rand.Rand, commit bool) {
	st.r, st.req, st.now, st.rng, st.commit = r, req, now, rng, commit
	st.d = &st.out
}

// finish ends the decision: st is zero again but for the candidates'
// scratch, so it keeps nothing of the request alive and the next start
// need not clear it.
func (st *decision) finish() {
	v := st.pick.peer.vals[:0] // the peers' scratch, kept as cands is
	*st = decision{cands: st.cands[:0]}
	st.pick.peer.vals = v
}

// run is the pipeline the package README describes, step by step.
func (st *decision) run() {
	d, req := st.d, st.req
	d.Requested, d.PrefixBlocks = req.Model, len(req.Prefix) // the rest is zero (finish)
	if st.snap = st.r.snap.Load(); st.snap == nil {
		st.reject(errNoTable())
		return
	}
	d.TableRevision = st.snap.Revision
	res, p := &st.res, &st.pick
	res.start(st.snap, req, st.rng)
	p.start(req, st.rng, st.now, st.r.clock.Nanos(st.now))
	p.alone = st.r.deciders == 1
	p.region.start(&st.r.regions, res.tenant)
	d.Region = st.r.cfg.Region
	p.eject.horizon = st.r.view.ejectHorizon

	// Which model?
	name, adapter, explicit := splitModel(req.Model)
	switch {
	case name == "":
		st.reject(errBadModel("model is required"))
		return
	case explicit && !table.ValidName(adapter):
		st.reject(errBadModel("model `" + req.Model + "` does not name a valid adapter after ':'"))
		return
	}
	res.adapter, res.explicit = adapter, explicit
	var found resolved
	if e := res.resolve(name, &found); e != nil {
		st.reject(e)
		return
	}
	// Which pool? (The canary draw is part of the pool rules.)
	res.place(&found)
	res.primary = res.target
	d.Model, d.Pool = res.target.Model, res.pool
	if !res.permitted(0) {
		st.reject(errNotAllowed(req.Tenant, req.Model))
		return
	}
	if !explicit {
		res.adapter = res.tenantAdapter(0)
	}
	d.Lora = res.adapter

	// Admit: what can be refused before looking at replicas.
	if e := st.checkContext(); e != nil {
		st.reject(e)
		return
	}
	if req.ResumeFrom == "" {
		if e := st.checkQuota(); e != nil {
			st.reject(e)
			return
		}
	}

	// Which replicas?
	if !st.gather() {
		if st.pinLost {
			st.reject(errPreviousResponse(req.Pin))
			return
		}
		st.noteCold()
		if !st.fallbacks(&found) {
			res.target, res.pool, res.adapter = res.primary, d.Pool, d.Lora
			st.reject(st.unavailable())
			st.chargeHeld()
			return
		}
	}
	d.Model, d.Version, d.Pool, d.Lora = res.target.Model, res.target.Version, res.pool, res.adapter
	if e := st.checkCapacity(); e != nil && req.ResumeFrom == "" {
		st.reject(e)
		return
	}

	// Which replica?
	p.adapter = res.adapter
	p.holders, p.pending = nil, nil
	p.ttftObjective = st.objective()
	d.TTFTObjective = p.ttftObjective
	p.fair = fairCheck{pool: res.pool, flight: st.r.fair.pools[shareKey{res.target.Model, res.pool}], tenant: res.tenantKey,
		weight: res.tenant.Weight(), shedAfter: ms(st.snap.ShedAfter(res.pool))}
	if len(req.Prefix) > 0 {
		p.holders = st.r.view.prefixes[res.target.Model]
		if p.keepsPending() {
			p.pending = st.r.view.pending[res.target.Model]
		}
		if st.r.view.kv.Len() > 0 {
			p.kv, p.kvModel, p.byKV = st.r.view.kv, res.target.Model, st.r.view.byKV
		}
	}
	var exact *kvindex.Index
	if st.r.view.kv.Len() > 0 {
		exact = st.r.view.kv
	}
	p.pd.start(st.snap.Models[res.target.Model], st.r.view.byModel[res.target.Model], &st.snap.Policy,
		prefixHoldings{m: p.holders, kv: exact, model: res.target.Model})
	if p.prof.dynamic {
		p.rescore()
	}
	if e := p.choose(); e != nil {
		p.reportFair(d) // a refusal for its share shows the shares
		st.reject(e)
		return
	}
	c := &p.cands[p.chosen]
	d.Replica, d.Score, d.PredictedTTFT = c.x.id, c.load, c.ttft
	if !c.x.ttftKnown() {
		d.PredictedTTFT, d.NoTTFTEvidence = 0, true
	}
	d.LoadViewAge = time.Duration(max(p.nowNano-c.x.viewNano, 0))
	d.Profile, d.Scorers, d.Weights, d.Values = p.prof.name, p.prof.names, p.prof.weights, p.valuesOf(p.chosen)
	if d.Version == "" {
		d.Version = c.x.reg.Version
	}
	p.report(d)
	if len(req.Prefix) > 0 && d.PrefixSource != PrefixKVEvents {
		d.KVFeedRefused = c.x.hb.KVEventsRefused
	}
	d.Panic = p.panicked
	mods := res.modifiers()
	if p.panicked {
		mods |= modPanic
	}
	d.Reason = p.reason(res.fallback, mods)
	d.ReplicaRegion = c.x.hb.Region
	if p.region.to != regionNone {
		d.Spilled, d.Reason = true, p.region.reason+d.Reason
		d.SpillPenalty, d.SpillPenaltySource = p.region.spillPenalty()
	}
	p.alternatives(d)
	if st.commit {
		st.commitTo(c.x)
	}
}

// commitTo records an admitted request: quota, in-flight, the adapter sent,
// the prefix blocks placed.
func (st *decision) commitTo(x *replica) {
	if st.req.ResumeFrom == "" {
		st.chargeQuota()
	} else {
		st.chargeContinuation()
	}
	x.inflight++
	st.r.fair.fly(st.req.ID, shareKey{st.res.target.Model, st.res.pool}, st.pick.fair.flight, st.res.tenantKey, st.pick.fair.weight,
		int64(st.req.PromptTokens)+int64(st.maxTokens()), st.now)
	st.d.SentPrefill = int(st.pick.cands[st.pick.chosen].uncached)
	x.sentPrefill = clamp32(int(x.sentPrefill) + st.d.SentPrefill)
	x.touch()
	if a := st.res.adapter; a != "" && !hasAdapter(x, a) {
		if x.nsent < len(x.sent) {
			x.sent[x.nsent] = a
			x.nsent++
		}
	}
	y := st.pick.pd.prefill
	if y != nil {
		y.inflight++
		y.touch()
	}
	if len(st.req.Prefix) > 0 {
		if m := st.r.view.prefixMap(st.res.target.Model, st.snap); m != nil {
			// The prefill replica computed the blocks and keeps them in
			// its cache; the decode replica holds them once pulled.
			if y != nil {
				m.remember(st.req.Prefix, y)
			}
			st.d.Placement = m.remember(st.req.Prefix, x)
		}
		// The blocks sent to a replica with the feed beyond those it held
		// count as held there until its engine reports them (those it
		// held it reports already or has pending).
		if st.pick.keepsPending() && x.kvLive {
			if m := st.r.view.pendingMap(st.res.target.Model, st.snap); m != nil {
				m.remember(st.req.Prefix[st.pick.cands[st.pick.chosen].held:], x)
			}
		}
	}
}

// reject ends the decision with e; Reason is the error code.
func (st *decision) reject(e *subjects.APIError) {
	st.d.Err, st.d.Reason = e, e.Code
	st.d.PrefixMatched = 0
}
