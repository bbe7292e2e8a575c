package adapter_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	adapter "github.com/switchyard-llm/switchyard/replica-adapter"
	"github.com/switchyard-llm/switchyard/subjects"
)

// TestBatchWorkHoldsAShortQueueAtAPriorityEngine: in front of an engine
// that schedules by priority, batch work takes the free slots of its batch
// and a queue of a quarter of a batch behind them, counted exactly: past
// that a batch request is refused at once (503 all_replicas_busy,
// Retry-After, the replica named) without reaching the engine, while an
// interactive request and a batch continuation still go to it.
func TestBatchWorkHoldsAShortQueueAtAPriorityEngine(t *testing.T) {
	e := newEnv(t)
	release := make(chan struct{})
	e.eng.handle(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte("data: {\"n\":1}\n\n"))
		w.(http.Flusher).Flush()
		if wait(r, release) {
			_, _ = w.Write([]byte("data: [DONE]\n\n"))
		}
	})
	defer close(release)
	cfg := e.config()
	cfg.MaxBatch, cfg.MaxQueue, cfg.EngineScheduling = 8, 64, adapter.SchedulingPriority
	e.start(cfg)
	e.waitReady("r-1")
	const hold = 8 + 2 // the batch and a quarter of it
	if got := subjects.BatchHold(cfg.MaxBatch, cfg.MaxQueue); got != hold {
		t.Fatalf("BatchHold(8, 64) = %d, want %d", got, hold)
	}
	batch := func(id string) nats.Header {
		h := chatHeaders(id)
		h.Set(subjects.HdrPriority, subjects.PriorityBatch)
		return h
	}
	for i := range hold {
		ch := e.request("r-1", batch(fmt.Sprint("b-", i)), `{"model":"x"}`)
		for range 3 { // accept, head, first chunk: it holds its place
			if m := next(t, ch); m.Header.Get(subjects.HdrStatus) == "503" {
				t.Fatalf("batch request %d of a hold of %d refused: %v", i, hold, m.Header)
			}
		}
	}
	refused := untilEnd(t, e.request("r-1", batch("b-beyond"), `{"model":"x"}`))
	if h := refused[0].Header; len(refused) != 1 || h.Get(subjects.HdrStatus) != "503" || !strings.Contains(string(refused[0].Data), subjects.CodeAllReplicasBusy) ||
		h.Get(subjects.HdrRetryAfter) == "" || h.Get(subjects.HdrRouteReplica) != "r-1" {
		t.Errorf("a batch request beyond the hold: %d messages, %v; want one 503 rejection with Retry-After naming r-1", len(refused), h)
	}
	if n := len(e.eng.requests()); n != hold {
		t.Errorf("the engine got %d requests, want the %d within the hold", n, hold)
	}
	resume := batch("b-resumed")
	resume.Set(subjects.HdrResume, "r-0")
	for _, h := range []nats.Header{chatHeaders("i-0"), resume} {
		if m := next(t, e.request("r-1", h, `{"model":"x"}`)); m.Header.Get(subjects.HdrStatus) == "503" {
			t.Errorf("%s with the batch full refused: %v", h.Get(subjects.HdrRequestID), m.Header)
		}
	}
}
