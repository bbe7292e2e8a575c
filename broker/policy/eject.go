package policy

import (
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
)

// Passive outlier ejection, as Envoy does it: a replica whose engine fails
// EjectAfter requests in a row (5xx, 429, 401/403, connection failures; a
// client's own 4xx never counts) leaves rotation for a back-off that doubles
// on each ejection, from EjectBase to EjectMax, and shrinks again by one step
// per EjectBase spent in rotation. An engine that keeps healthy /health and
// /metrics while refusing every request would otherwise keep drawing
// traffic.
//
// The evidence is the adapter's: it sees every answer of its engine,
// whichever broker sent the request, and reports the streak in its
// heartbeat. Every broker therefore ejects on the same evidence within one
// heartbeat of the others, with no broker-to-broker protocol.
const (
	EjectAfter = subjects.EjectAfterFailures
	EjectBase  = 10 * time.Second
	EjectMax   = 5 * time.Minute
	// MaxEjectedShare caps the share of a pool's candidates ejected at once
	// (the panic threshold): when more of them are ejected, the problem is
	// the pool's (or the model's), not a replica's, and ejecting would only
	// concentrate the load on what is left, so none is left out. A pool of
	// one never ejects.
	MaxEjectedShare = 0.5
)

// ejection is a replica's outlier-ejection state. Lock: Router.mu.
type ejection struct {
	until     int64  // unix ns: ejected while now < until
	count     int    // consecutive ejections: the back-off multiplier
	base      int    // the streak length already punished
	successes uint64 // the adapter's success count when base was set
}

// observeFailures updates the ejection state from a heartbeat; it reports
// whether the replica was ejected now, and for how long. Lock must be held.
func (x *replica) observeFailures(hb *subjects.Heartbeat, now int64) (time.Duration, bool) {
	e := &x.eject
	if hb.EngineSuccesses != e.successes {
		// A success ended the streak that was punished: a new one starts.
		e.base, e.successes = 0, hb.EngineSuccesses
	}
	n := hb.EngineFailures
	if n < e.base {
		e.base = n
	}
	if now < e.until || n-e.base < EjectAfter {
		return 0, false
	}
	if e.count > 0 && e.until > 0 {
		e.count = max(0, e.count-int((now-e.until)/int64(EjectBase)))
	}
	e.count++
	d := EjectMax
	if e.count <= 16 {
		d = min(EjectBase<<(e.count-1), EjectMax)
	}
	e.until, e.base = now+int64(d), n
	return d, true
}

// EjectedReplica is a replica out of rotation for its engine failures.
type EjectedReplica struct {
	Replica  string
	Until    time.Time
	Count    int
	Failures int
}

// Ejected lists the replicas ejected as of now.
func (r *Router) Ejected(now time.Time) []EjectedReplica {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []EjectedReplica
	for _, x := range r.view.replicas {
		if n := r.clock.Nanos(now); x.eject.until > n {
			out = append(out, EjectedReplica{Replica: x.id, Until: now.Add(time.Duration(x.eject.until - n)), Count: x.eject.count, Failures: x.hb.EngineFailures})
		}
	}
	return out
}
