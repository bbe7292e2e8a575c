package adapter

import (
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/subjects"
)

// Engine scheduling policies (Config.EngineScheduling), as vLLM's
// --scheduling-policy names them.
const (
	SchedulingFCFS     = "fcfs"
	SchedulingPriority = "priority"
)

// The engine priorities of the router's priorities: vLLM serves the lower
// value first, admitting a waiting interactive request before every
// waiting batch line, and when its KV cache runs short it preempts the
// running request of the worst value.
const (
	EnginePriorityInteractive = 0
	EnginePriorityBatch       = 1
)

// EnginePriority is the engine priority of a request the router sent with
// the Llm-Priority header h holds: what the broker decided, never what the
// body says.
func EnginePriority(h nats.Header) int {
	if h.Get(subjects.HdrPriority) == subjects.PriorityBatch {
		return EnginePriorityBatch
	}
	return EnginePriorityInteractive
}

// priorityField is the priority the engine gets. On an engine that
// schedules by priority it is the router's, written over any the client
// sent; on any other a client's priority is written to 0, which every
// engine accepts (vLLM refuses any other value without priority
// scheduling), and a body without one is sent without one.
func (a *Adapter) priorityField(h nats.Header) bodyField {
	if a.cfg.EngineScheduling == SchedulingPriority {
		return bodyField{keys: []string{"priority"}, value: strconv.AppendInt(nil, int64(EnginePriority(h)), 10)}
	}
	return bodyField{keys: []string{"priority"}, value: []byte("0"), replaces: true}
}

// noRoomForBatch reports whether h is batch work beyond what an engine
// scheduling by priority may hold for it: the requests this adapter has in
// flight fill the engine's batch and the short queue behind it
// (subjects.BatchHold). Batch lines waiting there are served after every
// interactive request and take each slot that frees when none waits.
// Brokers judge that room from heartbeats and load deltas, so a window of
// batch lines can arrive between two; past the hold they would take the
// queue's places, which interactive requests would find taken. Refused
// here, with the exact count, they are tried again after the Retry-After
// (a batch line is never failed for a 503). A continuation is not
// refused: it was admitted once.
func (a *Adapter) noRoomForBatch(h nats.Header) bool {
	if !a.behindInteractive(h) || h.Get(subjects.HdrResume) != "" {
		return false
	}
	lim := a.engineLimits()
	return a.InFlight() >= subjects.BatchHold(lim.batch, lim.queue)
}

// behindInteractive reports whether h is batch work at an engine that
// schedules by priority: it is admitted after every interactive request
// waiting, so its prompt is not prefill work an interactive request
// queues behind (the queued prefill tokens the adapter reports, from which
// brokers predict an interactive request's time to first token).
func (a *Adapter) behindInteractive(h nats.Header) bool {
	return a.cfg.EngineScheduling == SchedulingPriority && EnginePriority(h) == EnginePriorityBatch
}
