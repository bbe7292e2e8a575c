package lab

import (
	"math/rand/v2"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// Picker is one router instance: it learns replicas' load from heartbeats
// and picks a replica for each request. Switchyard's policy and the
// baselines implement it, so every experiment runs them the same way.
type Picker interface {
	// ObserveHeartbeat records a heartbeat as of now.
	ObserveHeartbeat(hb *subjects.Heartbeat, now time.Time)
	// Pick routes req: a replica id, or a rejection.
	Pick(req *Request, now time.Time, rng *rand.Rand) Pick
}

// Pick is a Picker's answer.
type Pick struct {
	Replica string
	// Prefill, when set, is the replica that runs the request's prefill
	// leg; Replica then decodes it with the KV pulled from there.
	Prefill string
	// Reason is the step that chose (the policy's reason codes), or the
	// rejection's code.
	Reason string
	// Err is set when the request was rejected.
	Err *subjects.APIError
}

// Baseline reasons.
const (
	ReasonRoundRobin  = "round-robin"
	ReasonRandom      = "random"
	ReasonLeastLoaded = "least-loaded"
	ReasonNoReplica   = subjects.CodeNoReplicas
)

var (
	_ Picker = (*RoundRobin)(nil)
	_ Picker = (*Random)(nil)
	_ Picker = (*LeastLoaded)(nil)
	_ Picker = (*PowerOfTwo)(nil)
)

// loadView is a baseline's view of the replicas: the last heartbeat of
// each and the requests this router sent since, counted the way the
// policy counts them (into the batch while it has room, then the queue).
type loadView struct {
	ids      []string
	w        table.LoadWeights
	dead     time.Duration
	hb       []subjects.Heartbeat
	seen     []time.Time
	inflight []int
	ready    []int // scratch: indices of live replicas
}

func newLoadView(ids []string, pol table.Policy) loadView {
	return loadView{
		ids: ids, w: pol.LoadWeights, dead: time.Duration(pol.DeadAfter),
		hb: make([]subjects.Heartbeat, len(ids)), seen: make([]time.Time, len(ids)),
		inflight: make([]int, len(ids)),
	}
}

func (v *loadView) observe(hb *subjects.Heartbeat, now time.Time) {
	for i, id := range v.ids {
		if id == hb.Replica {
			v.hb[i], v.seen[i], v.inflight[i] = *hb, now, 0
			return
		}
	}
}

// live returns the replicas with a ready heartbeat younger than dead_after.
func (v *loadView) live(now time.Time) []int {
	v.ready = v.ready[:0]
	for i := range v.ids {
		if !v.seen[i].IsZero() && v.hb[i].State == subjects.StateReady && now.Sub(v.seen[i]) < v.dead {
			v.ready = append(v.ready, i)
		}
	}
	return v.ready
}

// score is load_score (policy.load_weights), with or without this router's
// in-flight requests.
func (v *loadView) score(i int, inflight bool) float64 {
	hb := &v.hb[i]
	running, waiting := hb.Running, hb.Waiting
	maxBatch, maxQueue := max(hb.MaxBatch, 1), max(hb.MaxQueue, 1)
	if n := v.inflight[i]; inflight && n > 0 {
		add := min(max(maxBatch-running, 0), n)
		running += add
		waiting += n - add
	}
	return v.w.KV*hb.KVUsage + v.w.Queue*float64(waiting)/float64(maxQueue) + v.w.Batch*float64(running)/float64(maxBatch)
}

func (v *loadView) sent(i int) Pick {
	v.inflight[i]++
	return Pick{Replica: v.ids[i]}
}

func noReplica() Pick {
	e := subjects.NewError(503, subjects.CodeNoReplicas, "no live replica")
	return Pick{Reason: ReasonNoReplica, Err: e}
}

// RoundRobin cycles through the live replicas, blind to load and prefixes:
// a generic load balancer.
type RoundRobin struct {
	v    loadView
	next int
}

// NewRoundRobin returns a round-robin router over the replicas ids.
func NewRoundRobin(ids []string, pol table.Policy) *RoundRobin {
	return &RoundRobin{v: newLoadView(ids, pol)}
}

// ObserveHeartbeat implements Picker.
func (p *RoundRobin) ObserveHeartbeat(hb *subjects.Heartbeat, now time.Time) { p.v.observe(hb, now) }

// Pick implements Picker.
func (p *RoundRobin) Pick(_ *Request, now time.Time, _ *rand.Rand) Pick {
	live := p.v.live(now)
	if len(live) == 0 {
		return noReplica()
	}
	p.next++
	pk := p.v.sent(live[p.next%len(live)])
	pk.Reason = ReasonRoundRobin
	return pk
}

// Random picks a live replica uniformly.
type Random struct{ v loadView }

// NewRandom returns a random router over the replicas ids.
func NewRandom(ids []string, pol table.Policy) *Random { return &Random{v: newLoadView(ids, pol)} }

// ObserveHeartbeat implements Picker.
func (p *Random) ObserveHeartbeat(hb *subjects.Heartbeat, now time.Time) { p.v.observe(hb, now) }

// Pick implements Picker.
func (p *Random) Pick(_ *Request, now time.Time, rng *rand.Rand) Pick {
	live := p.v.live(now)
	if len(live) == 0 {
		return noReplica()
	}
	pk := p.v.sent(live[rng.IntN(len(live))])
	pk.Reason = ReasonRandom
	return pk
}

// LeastLoaded picks the replica with the lowest load_score among all live
// ones (ties: the first). With InFlight it adds the requests it sent since
// each heartbeat, as the policy does; without, it trusts the heartbeat
// alone, like a balancer reading scraped metrics.
type LeastLoaded struct {
	v        loadView
	InFlight bool
}

// NewLeastLoaded returns a global least-loaded router over the replicas ids.
func NewLeastLoaded(ids []string, pol table.Policy, inflight bool) *LeastLoaded {
	return &LeastLoaded{v: newLoadView(ids, pol), InFlight: inflight}
}

// ObserveHeartbeat implements Picker.
func (p *LeastLoaded) ObserveHeartbeat(hb *subjects.Heartbeat, now time.Time) { p.v.observe(hb, now) }

// Pick implements Picker.
func (p *LeastLoaded) Pick(_ *Request, now time.Time, _ *rand.Rand) Pick {
	live := p.v.live(now)
	if len(live) == 0 {
		return noReplica()
	}
	best := live[0]
	for _, i := range live[1:] {
		if p.v.score(i, p.InFlight) < p.v.score(best, p.InFlight) {
			best = i
		}
	}
	pk := p.v.sent(best)
	pk.Reason = ReasonLeastLoaded
	return pk
}

// PowerOfTwo samples two live replicas and takes the one with the lower
// load_score (in-flight requests included): the policy's load-aware step
// without any affinity, saturation penalty or staleness guard.
type PowerOfTwo struct{ v loadView }

// NewPowerOfTwo returns a power-of-two router over the replicas ids.
func NewPowerOfTwo(ids []string, pol table.Policy) *PowerOfTwo {
	return &PowerOfTwo{v: newLoadView(ids, pol)}
}

// ObserveHeartbeat implements Picker.
func (p *PowerOfTwo) ObserveHeartbeat(hb *subjects.Heartbeat, now time.Time) { p.v.observe(hb, now) }

// Pick implements Picker.
func (p *PowerOfTwo) Pick(_ *Request, now time.Time, rng *rand.Rand) Pick {
	live := p.v.live(now)
	switch len(live) {
	case 0:
		return noReplica()
	case 1:
		pk := p.v.sent(live[0])
		pk.Reason = "only-candidate"
		return pk
	}
	i, j := rng.IntN(len(live)), rng.IntN(len(live)-1)
	if j >= i {
		j++
	}
	a, b := live[i], live[j]
	if p.v.score(b, true) < p.v.score(a, true) {
		a = b
	}
	pk := p.v.sent(a)
	pk.Reason = "power-of-two"
	return pk
}
