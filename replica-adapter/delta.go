package adapter

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/subjects"
)

// Load deltas (docs/protocol.md, "Messages"): when a request starts, gets
// its first token or ends, the adapter tells the deciders its in-flight
// count and queued prefill on llm.load.<replica>, at most once every
// subjects.LoadDeltaEvery, so their load view is tens of milliseconds old
// instead of up to a heartbeat period. A burst of changes within the
// period becomes one delta at its end, with the state as it is then.
type deltas struct {
	// changed holds one pending change; more coalesce into it.
	changed chan struct{}
	seq     uint64 // the last delta's Seq; only the delta loop touches it

	mu   sync.Mutex
	ttft []subjects.TTFTSample // first tokens to report with the next delta
}

func newDeltas() deltas { return deltas{changed: make(chan struct{}, 1)} }

// loadChanged notes a change of the load; it never blocks.
func (a *Adapter) loadChanged() {
	select {
	case a.deltas.changed <- struct{}{}:
	default:
	}
}

// observedTTFT keeps a request's first token for the next delta beside
// the time to first token its decider predicted (Llm-Predicted-TTFT), so
// the decider named by Llm-Broker can measure its error. A request without
// a prediction, or with one out of range, is not reported; beyond
// subjects.MaxLoadDeltaTTFT in one period the rest are dropped.
func (a *Adapter) observedTTFT(h nats.Header, ttft time.Duration) {
	predicted, err := strconv.ParseInt(h.Get(subjects.HdrPredictedTTFT), 10, 64)
	broker := h.Get(subjects.HdrBroker)
	if err != nil || predicted <= 0 || predicted > subjects.MaxHeartbeatMillis || subjects.ValidToken(broker) != nil {
		return
	}
	observed := min(float64(ttft)/float64(time.Millisecond), subjects.MaxHeartbeatMillis)
	d := &a.deltas
	d.mu.Lock()
	if len(d.ttft) < subjects.MaxLoadDeltaTTFT {
		d.ttft = append(d.ttft, subjects.TTFTSample{Broker: broker, Predicted: float64(predicted), Observed: observed})
	}
	d.mu.Unlock()
}

// deltaLoop publishes a delta at the first change, then waits out the
// period before it looks at the next: changes within it coalesce.
func (a *Adapter) deltaLoop(ctx context.Context) {
	wait := time.NewTimer(subjects.LoadDeltaEvery)
	defer wait.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.deltas.changed:
		}
		a.publishDelta()
		wait.Reset(subjects.LoadDeltaEvery)
		select {
		case <-ctx.Done():
			return
		case <-wait.C:
		}
	}
}

// delta is the replica's load now, on top of its last heartbeat.
func (a *Adapter) delta() subjects.LoadDelta {
	d := &a.deltas
	d.seq++
	out := subjects.LoadDelta{
		Replica:             a.cfg.Replica,
		Heartbeat:           a.beats.seq.Load(),
		Seq:                 d.seq,
		Inflight:            min(max(a.InFlight(), 0), subjects.MaxHeartbeatCount),
		QueuedPrefillTokens: a.load.queuedUncached(),
	}
	d.mu.Lock()
	out.TTFT, d.ttft = d.ttft, nil
	d.mu.Unlock()
	out.SentUnixMillis = time.Now().UnixMilli()
	return out
}

func (a *Adapter) publishDelta() {
	b, err := json.Marshal(a.delta())
	if err == nil {
		err = a.nc.Publish(a.subj.Load(a.cfg.Replica), b)
	}
	if err != nil {
		a.log.Debug("load delta not sent", "err", err)
	}
}
