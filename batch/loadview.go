package batch

import (
	"math"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/decider"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// The load view's bounds and periods.
const (
	// viewStale leaves out a replica not heard from for three heartbeats:
	// its room is not known any more.
	viewStale = 3 * time.Second
	// maxViewReplicas bounds the replicas remembered: heartbeats of
	// made-up replicas cannot grow the view without bound.
	maxViewReplicas = 4096
	// reserveSlots × 1 s is how far back the interactive work's mean is
	// taken (Room, Reserve).
	reserveSlots = 5
	// AnnounceEvery is how often a batcher announces itself on
	// llm.batcher.presence; one not heard for three periods stops counting.
	AnnounceEvery = time.Second
)

// loadView is what a batcher sees of the pool: the replicas' heartbeats
// and load deltas (llm.heartbeat.*, llm.load.*), decoded and checked by
// the deciders' own decoders, and the batchers sharing the pool
// (llm.batcher.presence, counted as deciders count each other for quota
// shares). Room turns it into the lines this batcher may add.
type loadView struct {
	mu       sync.Mutex
	replicas map[string]*viewReplica
	recent   [reserveSlots]recentSlot
	peers    *decider.Peers
	bad      func(kind string) // counts a message refused
	wake     chan<- struct{}   // told when room may have opened
}

// viewReplica is one replica's last heartbeat and the load delta on top
// of it.
type viewReplica struct {
	hb       subjects.Heartbeat
	heard    time.Time
	delta    int // the delta's in-flight count less the heartbeat's
	deltaSeq uint64
	// mine counts this batcher's lines the replica accepted since its
	// last heartbeat or load delta came in: the adapter counts a line
	// before it accepts it and publishes both on one connection, so the
	// next one that comes in shows them.
	mine int
}

// recentSlot sums the interactive requests seen in one second.
type recentSlot struct {
	sec      int64
	sum, obs int
}

func newLoadView(self string, wake chan<- struct{}, bad func(string)) *loadView {
	return &loadView{replicas: map[string]*viewReplica{}, peers: decider.NewPeers(self), wake: wake, bad: bad}
}

func (v *loadView) onHeartbeat(m *nats.Msg, now time.Time) {
	var hb subjects.Heartbeat
	if _, err := decider.DecodeHeartbeat(m.Subject, m.Data, &hb); err != nil {
		v.bad("heartbeat")
		return
	}
	v.mu.Lock()
	x := v.replicas[hb.Replica]
	if x == nil {
		v.prune(now)
		if len(v.replicas) >= maxViewReplicas {
			v.mu.Unlock()
			v.bad("heartbeat")
			return
		}
		x = new(viewReplica)
		v.replicas[hb.Replica] = x
	}
	x.hb, x.heard, x.delta, x.deltaSeq, x.mine = hb, now, 0, 0, 0
	v.mu.Unlock()
	v.poke()
}

// onLoad applies a load delta on top of the heartbeat it follows, as a
// decider does; a delta of another heartbeat, or an older one, is dropped.
func (v *loadView) onLoad(m *nats.Msg) {
	var d subjects.LoadDelta
	if err := decider.DecodeLoadDelta(m.Subject, m.Data, &d); err != nil {
		v.bad("load_delta")
		return
	}
	v.mu.Lock()
	x := v.replicas[d.Replica]
	applied := x != nil && x.hb.Seq == d.Heartbeat && d.Seq > x.deltaSeq
	if applied {
		x.delta, x.deltaSeq, x.mine = d.Inflight-x.hb.Inflight, d.Seq, 0
	}
	v.mu.Unlock()
	if applied {
		v.poke()
	}
}

// accepted counts a line of this batcher that replica accepted.
func (v *loadView) accepted(replica string) {
	v.mu.Lock()
	if x := v.replicas[replica]; x != nil {
		x.mine++
	}
	v.mu.Unlock()
}

// onPresence counts another batcher.
func (v *loadView) onPresence(m *nats.Msg, now time.Time) {
	if _, ok := v.peers.Observe(m.Data, now, 3*AnnounceEvery); !ok {
		v.bad("presence")
	}
}

func (v *loadView) poke() {
	select {
	case v.wake <- struct{}{}:
	default:
	}
}

// prune forgets the replicas silent for viewStale. Lock should be held.
func (v *loadView) prune(now time.Time) {
	for id, x := range v.replicas {
		if now.Sub(x.heard) > viewStale {
			delete(v.replicas, id)
		}
	}
}

// Room is what the view shows a batcher at one moment.
type Room struct {
	// Known: some replica of the pool was heard from within viewStale.
	// Without it the batcher paces on refusals alone.
	Known bool
	// Free is the batch slots the pool's replicas have free: for each
	// ready replica, what the broker's batch-room check lets batch work
	// hold (policy.BatchRoom of its max_batch first come first served, or
	// subjects.BatchHold where the engine schedules by priority) less
	// what it holds (running and waiting, or its adapter's in-flight count
	// when that is more, and the lines of this batcher it accepted since
	// its last load delta).
	Free int
	// Interactive is the interactive requests the pool holds: what it
	// holds less the batch lines in flight (this batcher's, times the
	// batchers: each holds its share). Reserve is what interactive work
	// is predicted to take back within the next seconds: the mean of
	// what it held over the last reserveSlots seconds (its arrival rate
	// times its time in the engine, measured as such) less what it holds
	// now. Above that mean the engine's order serves interactive first
	// where it schedules by priority, and the ¾ rule keeps a quarter of
	// the batch where it does not.
	Interactive, Reserve int
	// Batchers is how many batchers share the room, this one included;
	// Share is this batcher's: (Free − Reserve) ÷ Batchers, rounded down,
	// and one more for the batchers of the lowest ids the remainder
	// covers, so that a slot that frees is taken by one batcher, not by
	// each.
	Batchers, Share int
}

// room computes the room for a batcher holding mine lines now.
func (v *loadView) room(now time.Time, mine int) Room {
	rank, batchers := v.peers.Rank(now, 3*AnnounceEvery)
	r := Room{Batchers: batchers}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.prune(now)
	// The pool rules send batch work to the batch pool, or to the general
	// pool's replicas when no replica serves in it.
	batchPool := false
	for _, x := range v.replicas {
		if x.hb.State == subjects.StateReady && x.hb.Pool == table.PoolBatch {
			batchPool = true
			break
		}
	}
	held := 0
	for _, x := range v.replicas {
		if x.hb.State != subjects.StateReady || (batchPool && x.hb.Pool != table.PoolBatch) {
			continue
		}
		r.Known = true
		h := max(0, max(x.hb.Running+x.hb.Waiting, x.hb.Inflight)+x.delta) + x.mine
		r.Free += max(0, batchLimit(&x.hb)-h)
		held += h
	}
	if !r.Known {
		return r
	}
	r.Interactive = max(0, held-mine*r.Batchers)
	r.Reserve = max(0, v.noteRecent(now, r.Interactive)-r.Interactive)
	if room := r.Free - r.Reserve; room > 0 {
		r.Share = room / r.Batchers
		if rank < room%r.Batchers {
			r.Share++
		}
	}
	return r
}

// batchLimit is how many requests a replica may hold and still take a
// batch line: the broker's batch-room check (broker/policy, hasRoom).
func batchLimit(hb *subjects.Heartbeat) int {
	if hb.Scheduling == subjects.SchedulingPriority {
		return subjects.BatchHold(hb.MaxBatch, hb.MaxQueue)
	}
	return int(math.Ceil(policy.BatchRoom * float64(hb.MaxBatch)))
}

// noteRecent records n interactive requests at now and returns their
// mean over the last reserveSlots seconds: each second's mean, averaged,
// so that a second of many looks weighs no more than one of few. Lock
// should be held.
func (v *loadView) noteRecent(now time.Time, n int) int {
	sec := now.Unix()
	s := &v.recent[sec%reserveSlots]
	if s.sec != sec {
		*s = recentSlot{sec: sec}
	}
	s.sum += n
	s.obs++
	var sum float64
	secs := 0
	for _, x := range v.recent {
		if x.obs > 0 && sec-x.sec < reserveSlots {
			sum += float64(x.sum) / float64(x.obs)
			secs++
		}
	}
	return int(math.Round(sum / float64(secs)))
}
