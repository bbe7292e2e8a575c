package policy

import (
	"math/rand/v2"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// decision is the working state of one decision: Router.st, under
// Router.mu.
type decision struct {
	r      *Router
	req    *Request
	now    time.Time
	rng    *rand.Rand
	d      *Decision
	commit bool
	snap   *table.Snapshot

	tenant    *table.Tenant // nil: no rules
	tenantKey string        // quota bucket key
	tier      string

	adapter  string // LoRA to apply, "" for none
	explicit bool   // the request named "model:adapter"

	path        [maxHops]string // names resolved so far (loop safety)
	npath       int
	promptRead  bool
	promptBytes []byte

	primary, target, stable table.Target
	pool                    string
	poolFallback            bool
	canaryGone              bool
	fallback                string // alias fallen back to

	cands               []cand
	nfresh, nfull       int
	release, saturation float64
	quota               quotaCheck

	endpoint uint8 // the request's endpoint bit; 0 filters nothing
	unserved int   // replicas left out because their engine lacks the endpoint
	pinLost  bool  // the pinned replica cannot serve: gone, draining, another model

	chosen, released, other int // candidate indices, -1 when none
	deadlineLoser           int
	deadlineSwitch          bool
	loraLoaded              bool
	pair                    [2]int // the power-of-two draw, lower load_score first
	drawn                   bool   // pair is drawn
	step                    *step  // the replica-choice step that decided
}

// run is the pipeline the package README describes, step by step.
func (st *decision) run() {
	d, req := st.d, st.req
	*d = Decision{Requested: req.Model, PrefixBlocks: len(req.Prefix)}
	st.chosen, st.released, st.other, st.deadlineLoser = -1, -1, -1, -1
	if st.snap = st.r.snap.Load(); st.snap == nil {
		st.reject(errNoTable())
		return
	}
	d.TableRevision = st.snap.Revision
	st.lookupTenant()
	st.endpoint, st.unserved, st.pinLost = subjects.EndpointBit(req.Endpoint), 0, false

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
	st.adapter, st.explicit = adapter, explicit
	var res resolved
	if e := st.resolve(name, &res); e != nil {
		st.reject(e)
		return
	}
	// Which pool? (The canary draw is part of the pool rules.)
	st.place(&res)
	st.primary = st.target
	d.Model, d.Pool = st.target.Model, st.pool
	if !st.permitted(0) {
		st.reject(errNotAllowed(req.Tenant, req.Model))
		return
	}
	if !explicit {
		st.adapter = st.tenantAdapter(0)
	}
	d.Lora = st.adapter

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
		if !st.fallbacks(&res) {
			st.target, st.pool, st.adapter = st.primary, d.Pool, d.Lora
			st.reject(st.unavailable())
			st.chargeHeld()
			return
		}
	}
	d.Model, d.Version, d.Pool, d.Lora = st.target.Model, st.target.Version, st.pool, st.adapter
	if e := st.checkCapacity(); e != nil && req.ResumeFrom == "" {
		st.reject(e)
		return
	}

	// Which replica?
	st.choose()
	if e := st.checkDeadline(); e != nil {
		st.reject(e)
		return
	}
	c := &st.cands[st.chosen]
	d.Replica, d.Score = c.x.id, c.load
	if d.Version == "" {
		d.Version = c.x.reg.Version
	}
	if st.deadlineSwitch {
		d.PrefixMatched = 0 // the prefix step's replica was not kept
	}
	d.Reason = reasonOf(st.fallback, st.poolFallback, st.canaryGone, st.deadlineSwitch, st.step)
	st.alternatives()
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
	if a := st.adapter; a != "" && !hasAdapter(x, a) {
		if x.nsent < len(x.sent) {
			x.sent[x.nsent] = a
			x.nsent++
		}
	}
	if len(st.req.Prefix) > 0 {
		if m := st.r.prefixMapLocked(st.target.Model); m != nil {
			st.d.Placement = m.remember(st.req.Prefix, x)
		}
	}
}

// reject ends the decision with e; Reason is the error code.
func (st *decision) reject(e *subjects.APIError) {
	st.d.Err, st.d.Reason = e, e.Code
	st.d.PrefixMatched = 0
}
