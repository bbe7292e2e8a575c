package policy

import (
	"strconv"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
)

// Fair shedding. The router never queues, so when a pool cannot take all
// it is sent, fairness between tenants comes from who is refused: the
// tenants holding more of the pool's in-flight tokens than their share
// weight gives them, batch work first. A tenant within its share keeps
// being admitted.
//
// Each decider counts the tokens (prompt + max_tokens) of the requests it
// admitted, per pool and tenant, until the adapter's usage event naming it
// settles them: the reservations of the tenant quotas, settled the same
// way. Shares are ratios, and deciders see even slices of every tenant's
// traffic (the queue group spreads the brokers' requests, a balancer the
// gateways'), so a decider's shares are the pool's, as its bucket of
// limit ÷ n is its part of a quota.

// BatchShare is the part of its fair share a tenant's batch work may hold
// when the pool sheds: batch work is refused before interactive work.
const BatchShare = 0.5

// Flights are bounded like reservations: one whose usage never came (an
// adapter that died mid-request) stops counting after FlightTTL, and past
// MaxFlights a new one is not counted.
const (
	MaxFlights       = 1 << 17
	FlightTTL        = 10 * time.Minute
	flightSweepEvery = time.Minute
)

// shareKey names a pool's ledger: the model and the pool of its candidates.
type shareKey struct{ model, pool string }

// poolFlight is the tokens this decider admitted to one pool and not yet
// settled, by tenant (the quota key: tenants missing from the table count
// as the default tenant, so made-up names cannot grow it). Lock: Router.mu.
type poolFlight struct {
	total int64
	// weights is the sum of the weights of the tenants with tokens in
	// flight: the denominator of a fair share.
	weights float64
	tenants map[string]tenantFlight
}

type tenantFlight struct {
	tokens int64
	weight float64 // the weight counted in poolFlight.weights
}

// flight is one admitted request's entry in its pool's ledger, held under
// its request id.
type flight struct {
	pool   *poolFlight
	tenant string
	tokens int64
	at     time.Time
}

func (f *poolFlight) add(tenant string, weight float64, tokens int64) {
	t := f.tenants[tenant]
	if t.tokens == 0 {
		f.weights += weight
	} else {
		f.weights += weight - t.weight
	}
	t.tokens += tokens
	t.weight = weight
	f.tenants[tenant] = t
	f.total += tokens
}

func (f *poolFlight) settle(tenant string, tokens int64) {
	t, ok := f.tenants[tenant]
	if !ok {
		return
	}
	tokens = min(tokens, t.tokens)
	t.tokens -= tokens
	f.total -= tokens
	if t.tokens > 0 {
		f.tenants[tenant] = t
		return
	}
	delete(f.tenants, tenant)
	f.weights -= t.weight
	if len(f.tenants) == 0 {
		f.total, f.weights = 0, 0 // no drift carried into the next busy spell
	}
}

// fairShares are the pools' in-flight ledgers: each admitted request's
// entry by request id, counted in its pool's ledger until its usage event
// settles it. Lock: Router.mu.
type fairShares struct {
	pools   map[shareKey]*poolFlight
	flights map[string]flight
	swept   time.Time // when flights were last swept for FlightTTL
}

func newFairShares() fairShares {
	return fairShares{pools: map[shareKey]*poolFlight{}, flights: map[string]flight{}}
}

// fly counts an admitted request in its pool's ledger under its request
// id; a request without an id cannot be settled and is not counted. f is
// the ledger of k when the caller has it (nil: looked up).
func (fs *fairShares) fly(id string, k shareKey, f *poolFlight, tenant string, weight float64, tokens int64, now time.Time) {
	if id == "" || tokens <= 0 {
		return
	}
	if now.Sub(fs.swept) >= flightSweepEvery {
		fs.sweep(now)
	}
	if old, ok := fs.flights[id]; ok {
		// A request id seen twice: the first is settled now rather than
		// never.
		old.pool.settle(old.tenant, old.tokens)
	} else if len(fs.flights) >= MaxFlights {
		return
	}
	if f == nil {
		f = fs.pools[k]
	}
	if f == nil {
		f = &poolFlight{tenants: map[string]tenantFlight{}}
		fs.pools[k] = f
	}
	f.add(tenant, weight, tokens)
	fs.flights[id] = flight{pool: f, tenant: tenant, tokens: tokens, at: now}
}

// land settles the flight of request id, once.
func (fs *fairShares) land(id string) {
	f, ok := fs.flights[id]
	if !ok {
		return
	}
	delete(fs.flights, id)
	f.pool.settle(f.tenant, f.tokens)
}

// sweep stops counting the flights older than FlightTTL.
func (fs *fairShares) sweep(now time.Time) {
	fs.swept = now
	for id, f := range fs.flights {
		if now.Sub(f.at) > FlightTTL {
			delete(fs.flights, id)
			f.pool.settle(f.tenant, f.tokens)
		}
	}
}

// Flights is the number of admitted requests counted in the pools'
// ledgers and not yet settled.
func (r *Router) Flights() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.fair.flights)
}

// fairCheck is the fair-share check's state, set by the decision before
// the pick: the pool's ledger, the request's tenant and its weight, and
// the pool's shed_after; then what the check found.
type fairCheck struct {
	pool      string
	flight    *poolFlight
	tenant    string
	weight    float64
	shedAfter float64 // ms; 0: the pool sheds only when saturated

	shedding    bool
	share, fair float64
	loser       int // the candidate it switched away from, -1 when none
}

// fairShare uses the room a pool has left before it sheds (see
// underShedAfter), and refuses, when the pool sheds, a request whose
// tenant holds more of the pool's in-flight tokens than its fair share (its weight over
// the weights of the tenants in flight, itself included) and is the
// furthest above it: the tenants furthest above their share are refused
// first, so one that floods the pool is cut back before a tenant that is
// only above its share for the moment (a tenant's tokens in flight swing
// by a quarter from second to second) is touched. A batch request is
// refused already above BatchShare of its fair share. 429
// fair_share_exceeded, Retry-After the lowest predicted TTFT (the queue
// that has to drain), 1–30 s. A continuation was admitted once and is
// never refused here.
func (p *pick) fairShare() (switched bool, e *subjects.APIError) {
	f := &p.fair
	f.shedding, f.loser = false, -1
	if !p.sheds() {
		return p.underShedAfter(), nil
	}
	if f.flight == nil || f.flight.total <= 0 {
		return false, nil // nothing in flight: no share to exceed, none to show
	}
	f.shedding = true
	if p.req.ResumeFrom != "" {
		return false, nil
	}
	t := f.flight.tenants[f.tenant]
	weights := f.flight.weights + f.weight - t.weight // t.weight is 0 when not in flight
	f.share = float64(t.tokens) / float64(f.flight.total)
	f.fair = f.weight / weights
	limit := f.fair
	if p.req.Priority == subjects.PriorityBatch {
		limit *= BatchShare
	}
	if f.share <= limit || p.req.Priority != subjects.PriorityBatch && !f.furthest(t.tokens) {
		return false, nil
	}
	e = subjects.NewError(429, subjects.CodeFairShareExceeded, "Pool "+f.pool+" is shedding load and tenant "+f.tenant+
		" holds "+percent(f.share)+" of its tokens in flight, above its fair share of "+percent(limit)+"; retry after the Retry-After delay.")
	e.RetryAfter = min(max(millis(p.cands[p.fastest()].ttft), RetryBusyMin), RetryBusyMax)
	return false, e
}

// underShedAfter moves a request whose chosen replica is predicted above
// the pool's shed_after to the candidate with the lowest prediction, when
// that one is below it: the room the pool has left is used before anyone
// is shed, and a pool sheds only once every replica is above it.
func (p *pick) underShedAfter() bool {
	f := &p.fair
	if f.shedAfter <= 0 || p.cands[p.chosen].ttft <= f.shedAfter {
		return false
	}
	best := p.fastest()
	if best == p.chosen || p.cands[best].ttft > f.shedAfter {
		return false
	}
	f.loser, p.chosen = p.chosen, best
	return true
}

// furthest reports whether the request's tenant, holding tokens, is at
// least as far above its fair share as every other tenant in flight: a
// share over a fair share is tokens over weight times one factor common
// to all (the pool's weights over its tokens), so tokens ÷ weight orders
// them.
func (f *fairCheck) furthest(tokens int64) bool {
	mine := float64(tokens) / f.weight
	for name, o := range f.flight.tenants {
		if name != f.tenant && float64(o.tokens)/o.weight > mine {
			return false
		}
	}
	return true
}

// sheds reports whether the pool sheds: every candidate has fresh load
// data and is saturated (the seed's rule) or, with shed_after, predicted
// above it.
func (p *pick) sheds() bool {
	for i := range p.cands {
		c := &p.cands[i]
		if !c.fresh || !c.saturated && (p.fair.shedAfter <= 0 || c.ttft <= p.fair.shedAfter) {
			return false
		}
	}
	return len(p.cands) > 0
}

// reportFair writes the shares into the decision when the pool shed: the
// request's tenant first, then the tenants holding the most.
func (p *pick) reportFair(d *Decision) {
	f := &p.fair
	if !f.shedding {
		return
	}
	weights := f.flight.weights
	t := f.flight.tenants[f.tenant]
	weights += f.weight - t.weight
	d.Shares[0] = subjects.TenantShare{Tenant: f.tenant, Tokens: t.tokens, Share: f.share, Weight: f.weight, FairShare: f.fair}
	d.NShares = 1
	for name, o := range f.flight.tenants {
		if name == f.tenant {
			continue
		}
		s := subjects.TenantShare{Tenant: name, Tokens: o.tokens, Share: float64(o.tokens) / float64(f.flight.total),
			Weight: o.weight, FairShare: o.weight / weights}
		// Insert by tokens, largest first, keeping the first len(Shares).
		i := d.NShares
		for i > 1 && (d.Shares[i-1].Tokens < s.Tokens || d.Shares[i-1].Tokens == s.Tokens && d.Shares[i-1].Tenant > s.Tenant) {
			if i < len(d.Shares) {
				d.Shares[i] = d.Shares[i-1]
			}
			i--
		}
		if i < len(d.Shares) {
			d.Shares[i] = s
			d.NShares = min(d.NShares+1, len(d.Shares))
		}
	}
}

func (p *pick) whyFair(i int) string {
	if i == p.fair.loser {
		return WhyShedAfter
	}
	return ""
}

// percent renders a share as a whole percentage.
func percent(v float64) string { return strconv.Itoa(int(v*100+0.5)) + "%" }
