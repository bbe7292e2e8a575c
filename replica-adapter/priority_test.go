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

// TestBatchWorkNeverQueuesAtAPriorityEngine: in front of an engine that
// schedules by priority, batch work takes only free slots of its batch,
// counted exactly: with the batch full, a batch request is refused at once
// (503 all_replicas_busy, Retry-After, the replica named) without reaching
// the engine, while an interactive request and a batch continuation still
// go to it.
func TestBatchWorkNeverQueuesAtAPriorityEngine(t *testing.T) {
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
	cfg.MaxBatch, cfg.EngineScheduling = 2, adapter.SchedulingPriority
	e.start(cfg)
	e.waitReady("r-1")
	batch := func(id string) nats.Header {
		h := chatHeaders(id)
		h.Set(subjects.HdrPriority, subjects.PriorityBatch)
		return h
	}
	for i := range 2 {
		ch := e.request("r-1", batch(fmt.Sprint("b-", i)), `{"model":"x"}`)
		for range 3 { // accept, head, first chunk: it holds a slot
			if m := next(t, ch); m.Header.Get(subjects.HdrStatus) == "503" {
				t.Fatalf("batch request %d of a batch of 2 refused: %v", i, m.Header)
			}
		}
	}
	refused := untilEnd(t, e.request("r-1", batch("b-2"), `{"model":"x"}`))
	if h := refused[0].Header; len(refused) != 1 || h.Get(subjects.HdrStatus) != "503" || !strings.Contains(string(refused[0].Data), subjects.CodeAllReplicasBusy) ||
		h.Get(subjects.HdrRetryAfter) == "" || h.Get(subjects.HdrRouteReplica) != "r-1" {
		t.Errorf("a batch request beyond the batch: %d messages, %v; want one 503 rejection with Retry-After naming r-1", len(refused), h)
	}
	if n := len(e.eng.requests()); n != 2 {
		t.Errorf("the engine got %d requests, want the 2 that had slots", n)
	}
	resume := batch("b-3")
	resume.Set(subjects.HdrResume, "r-0")
	for _, h := range []nats.Header{chatHeaders("i-0"), resume} {
		if m := next(t, e.request("r-1", h, `{"model":"x"}`)); m.Header.Get(subjects.HdrStatus) == "503" {
			t.Errorf("%s with the batch full refused: %v", h.Get(subjects.HdrRequestID), m.Header)
		}
	}
}
