package policy

import (
	"slices"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
)

// The candidate filters of the filters table, in its order.

// live: registered with a heartbeat seen, the effective state ready (the
// more restrictive of the table's and the heartbeat's), and a heartbeat
// younger than dead_after (no heartbeat, no candidate).
// Router.Live asks the same of a stored response's replica.
func (p *pick) live(x *replica) bool { return x.liveAt(p.nowNano, p.dead) }

func (x *replica) liveAt(now, dead int64) bool {
	return x.ready && max(now-x.hbNano, 0) < dead
}

// panics reports whether the group list is in panic, as Envoy's panic
// threshold: fewer than below of its ready replicas (registered, heard
// from, ready: neither draining nor failing health checks) were heard
// within dead_after. So many silent at once is more likely the observer's
// view than the replicas' (a starved or partitioned decider, a stalled
// feed), and routing all the load onto the few that look alive would
// overload them: the choice is then over all ready replicas, and the
// gateway's retry excludes one that proves gone (no-responders). A group
// where none looks alive is not in panic: its model is gone as far as
// anyone can tell, and the alias's fallbacks serve (a decider that was
// away itself keeps its replicas: Router.Reconnected).
func (p *pick) panics(list []*replica, below float64) bool {
	if below <= 0 {
		return false
	}
	// Ready replicas never outnumber the list: once below of the list is
	// alive, the group is not in panic, and the healthy case stops there
	// instead of walking every replica of every decision's group.
	enough := below * float64(len(list))
	ready, alive := 0, 0
	for _, x := range list {
		if !x.ready {
			continue
		}
		ready++
		if x.liveAt(p.nowNano, p.dead) {
			if alive++; float64(alive) >= enough {
				return false
			}
		}
	}
	return alive > 0 && float64(alive) < below*float64(ready)
}

// A replica's flags (replica.flags), what the filters with flags test.
const (
	flagReady   = 1 << 0 // replica.ready
	flagPrefill = 1 << 1 // replica.prefillOnly
	// The endpoints it serves (replica.serves) are the high byte.
	flagServesShift = 8
)

func (p *pick) liveFlags() (mask, want uint16) { return flagReady, flagReady }

func (p *pick) endpointFlags() (mask, want uint16) {
	b := uint16(p.endpoint.bit) << flagServesShift
	return b, b
}

func (p *pick) notPrefillFlags() (mask, want uint16) { return flagPrefill, 0 }

// ejectFilter is not-ejected's state for the group in hand.
type ejectFilter struct {
	horizon int64      // Router.ejectHorizon: no ejection lasts past it
	list    []*replica // the group
	skip    bool       // leave the ejected replicas out
	found   bool       // the group has ejected live replicas: report them
	panic   bool       // more than MaxEjectedShare of the group is ejected: kept in
}

// ejectedOn decides whether the ejected replicas of list are left out:
// yes unless more than MaxEjectedShare of the live ones are ejected (the
// panic threshold, see eject.go).
func (p *pick) ejectedOn(list []*replica) bool {
	e := &p.eject
	e.skip, e.found, e.panic = false, false, false
	if p.nowNano >= e.horizon {
		return false
	}
	live, ejected := 0, 0
	for _, x := range list {
		if !p.live(x) {
			continue
		}
		live++
		if p.nowNano < x.eject.until {
			ejected++
		}
	}
	if ejected == 0 {
		return false
	}
	e.skip = float64(ejected) <= MaxEjectedShare*float64(live)
	e.found, e.panic = true, !e.skip
	e.list = list
	return e.skip
}

func (p *pick) notEjected(x *replica) bool { return p.nowNano >= x.eject.until }

// reportEjected names the group's ejected replicas in the decision.
func (p *pick) reportEjected(d *Decision) {
	if !p.eject.found {
		return
	}
	d.NEjected, d.EjectPanic = 0, p.eject.panic
	for _, x := range p.eject.list {
		if p.nowNano < x.eject.until && d.NEjected < len(d.Ejected) {
			d.Ejected[d.NEjected] = x.id
			d.NEjected++
		}
	}
}

// excludeOn: the gateway excludes the replicas that refused or failed this
// request already (Llm-Exclude).
func (p *pick) excludeOn([]*replica) bool { return len(p.req.Exclude) > 0 }

func (p *pick) notExcluded(x *replica) bool { return !slices.Contains(p.req.Exclude, x.id) }

// SilentAfter is how long an avoided replica may go unheard and still be
// taken as slow (two heartbeats, two of the gateway's accept timeouts by
// default).
const SilentAfter = 2 * time.Second

// preferNotAvoided leaves out the candidates the request avoids
// (Llm-Avoid: they were slow to accept it) while any other is left. Slow
// is not dead: unlike an excluded replica, an avoided one stays the
// candidate of last resort, so a request whose only replica is slow goes
// to it again instead of failing no_replicas. An avoided replica not heard
// from for SilentAfter (this router's own deafness not counted) is not
// slow but silent, cut off or frozen: it is left out like an excluded one,
// so the request goes to the model's fallbacks.
func (p *pick) preferNotAvoided(cands []cand) []cand {
	if len(p.req.Avoid) == 0 {
		return cands
	}
	k, silent := 0, 0
	for i := range cands {
		switch x := cands[i].x; {
		case !slices.Contains(p.req.Avoid, x.id):
			k++
		case p.silent(x):
			silent++
		}
	}
	if k == len(cands) || k == 0 && silent == 0 {
		return cands
	}
	keepAvoided := k == 0 // only avoided ones: those heard stay, the last resort
	k = 0
	p.nfresh, p.nfull = 0, 0
	for i := range cands {
		c := cands[i]
		if slices.Contains(p.req.Avoid, c.x.id) && (!keepAvoided || p.silent(c.x)) {
			c.x.mark = 0 // not a candidate of this decision
			continue
		}
		if c.fresh {
			p.nfresh++
		}
		if c.full {
			p.nfull++
		}
		c.x.ci = int32(k)
		cands[k] = c
		k++
	}
	return cands[:k]
}

// silent: x has not been heard from for SilentAfter, this router's own
// deafness not counted.
func (p *pick) silent(x *replica) bool { return p.nowNano-x.hbNano >= int64(SilentAfter)+p.deaf }

// pinOn: a request continuing a stored response has the replica holding it
// as its only possible candidate.
func (p *pick) pinOn([]*replica) bool { return p.req.Pin != "" }

func (p *pick) pinnedTo(x *replica) bool { return x.id == p.req.Pin }

// endpointFilter is serves-endpoint's state: the request's endpoint bit,
// and how many replicas it left out (when none of the model serves the
// endpoint, the rejection says so).
type endpointFilter struct {
	bit      uint8
	unserved int
}

func (f *endpointFilter) start(req *Request) {
	f.bit, f.unserved = subjects.EndpointBit(req.Endpoint), 0
}

// endpointOn: a request without a known endpoint filters nothing.
func (p *pick) endpointOn([]*replica) bool { return p.endpoint.bit != 0 }

// servesEndpoint: the engine serves the request's endpoint (the
// heartbeat's endpoints, else the registration's, else chat, completions
// and embeddings).
func (p *pick) servesEndpoint(x *replica) bool {
	if !p.serves(x) {
		p.endpoint.unserved++
		return false
	}
	return true
}

func (p *pick) serves(x *replica) bool { return x.serves&p.endpoint.bit == p.endpoint.bit }
