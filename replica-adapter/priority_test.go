package adapter_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/enginesim"
	"github.com/switchyard-llm/switchyard/internal/testkit"
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

// TestBatchPromptsAreNotQueuedAheadOfInteractive: at an engine that
// schedules by priority, batch lines are admitted after every interactive
// request waiting, so the prefill tokens the adapter reports queued (what
// brokers predict an interactive request's first token from) leave their
// prompts out: batch work waiting there does not make an interactive
// request look slower to serve.
func TestBatchPromptsAreNotQueuedAheadOfInteractive(t *testing.T) {
	e := newEnv(t)
	release := make(chan struct{})
	e.eng.handle(func(w http.ResponseWriter, r *http.Request) {
		if wait(r, release) {
			streamSSE(t)(w, r)
		}
	})
	cfg := e.config()
	cfg.HeartbeatEvery, cfg.EngineScheduling = 30*time.Minute, adapter.SchedulingPriority
	e.start(cfg)
	e.waitReady("r-1")
	deltas := loadDeltas(t, e, "r-1")
	var replies []<-chan *nats.Msg
	for i, priority := range []string{subjects.PriorityBatch, subjects.PriorityBatch, subjects.PriorityInteractive} {
		h := chatHeaders(fmt.Sprint("q-", i))
		h.Set(subjects.HdrPriority, priority)
		h.Set(subjects.HdrPromptTokens, "100")
		replies = append(replies, e.request("r-1", h, `{"model":"sim-model","messages":[]}`))
	}
	// Once the engine has the three, their prompts are counted; the
	// delta a fourth request (no prompt told) brings says what is queued.
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if n := len(e.eng.requests()); n != 3 {
			return fmt.Errorf("the engine has %d requests", n)
		}
		return nil
	})
	replies = append(replies, e.request("r-1", chatHeaders("q-3"), `{"model":"sim-model","messages":[]}`))
	var last subjects.LoadDelta
	for last.Inflight < 4 {
		select {
		case last = <-deltas:
		case <-time.After(5 * time.Second):
			t.Fatalf("no delta with the 4 requests in flight: %+v", last)
		}
	}
	if last.QueuedPrefillTokens != 100 {
		t.Errorf("two batch lines and an interactive request of 100 prompt tokens each: %d queued, want the interactive one's 100", last.QueuedPrefillTokens)
	}
	close(release)
	for _, r := range replies {
		untilEnd(t, r)
	}
}

// TestHeartbeatCountsBatchLinesWaiting: at an engine that schedules by
// priority, the heartbeat says how many of the requests waiting for a
// batch slot are batch lines (batch_waiting), which brokers leave out of
// an interactive request's wait; an interactive request waiting is not
// one of them, and once the batch has room none waits.
func TestHeartbeatCountsBatchLinesWaiting(t *testing.T) {
	const maxBatch = 8 // its hold, a quarter more, lets two batch lines wait
	e := newEnv(t)
	_, hs := simEngine(t, enginesim.ServerConfig{Speed: 1, Engine: enginesim.Config{MaxBatch: maxBatch, Scheduling: enginesim.SchedulingPriority}})
	cfg := e.config()
	cfg.EngineURL, cfg.MaxBatch, cfg.EngineScheduling = hs.URL, maxBatch, adapter.SchedulingPriority
	e.start(cfg)
	e.waitReady("r-1")
	nextHB := heartbeats(t, e.nc, "r-1")
	send := func(id, priority string, maxTokens int) <-chan *nats.Msg {
		h := chatHeaders(id)
		h.Set(subjects.HdrPriority, priority)
		return e.request("r-1", h, fmt.Sprintf(`{"model": "sim-model", "messages": [{"role": "user", "content": "%s"}], "max_tokens": %d, "stream": true}`, id, maxTokens))
	}
	// Interactive requests that generate for minutes fill the batch; two
	// batch lines and an interactive request wait behind them.
	var fill []<-chan *nats.Msg
	for i := range maxBatch {
		fill = append(fill, send(fmt.Sprint("fill-", i), subjects.PriorityInteractive, 100000))
	}
	var waiting []<-chan *nats.Msg
	for _, id := range []string{"line-0", "line-1"} {
		waiting = append(waiting, send(id, subjects.PriorityBatch, 3))
	}
	waiting = append(waiting, send("interactive", subjects.PriorityInteractive, 3))
	hb := waitHeartbeat(t, nextHB, func(hb subjects.Heartbeat) error {
		if hb.Inflight != maxBatch+3 || hb.Running != maxBatch || hb.Waiting != 3 {
			return fmt.Errorf("heartbeat: %d in flight, the engine runs %d and queues %d; want %d, %d and 3", hb.Inflight, hb.Running, hb.Waiting, maxBatch+3, maxBatch)
		}
		return nil
	})
	if hb.BatchWaiting != 2 {
		t.Errorf("heartbeat batch_waiting %d with two batch lines and an interactive request waiting, want 2", hb.BatchWaiting)
	}

	for i := range fill {
		if err := e.nc.PublishMsg(&nats.Msg{Subject: subjects.New("").ReplicaCancel("r-1"), Header: nats.Header{subjects.HdrRequestID: {fmt.Sprint("fill-", i)}}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ch := range append(fill, waiting...) {
		untilEnd(t, ch)
	}
	hb = waitHeartbeat(t, nextHB, func(hb subjects.Heartbeat) error {
		if hb.Inflight != 0 {
			return fmt.Errorf("heartbeat: %d in flight", hb.Inflight)
		}
		return nil
	})
	if hb.BatchWaiting != 0 {
		t.Errorf("heartbeat batch_waiting %d with nothing in flight", hb.BatchWaiting)
	}
}
