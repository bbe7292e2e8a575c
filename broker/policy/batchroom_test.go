package policy_test

import (
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/subjects"
)

// TestBatchWorkTakesOnlyRoom: a batch request goes only to a replica that
// keeps room for interactive requests (running and waiting below BatchRoom
// of its batch, KV below the release threshold), else it is the 503 the
// batcher paces itself on; an interactive request is not held to it.
func TestBatchWorkTakesOnlyRoom(t *testing.T) {
	e := newEnv(t)
	batch := func() *policy.Request { q := chat("chat-large"); q.Priority = subjects.PriorityBatch; return q }
	if d := e.decide(batch()); d.Err != nil || d.Replica != "l70-batch-0" {
		t.Fatalf("an idle batch replica: %+v", d)
	}
	for _, c := range []struct {
		name             string
		kv               float64
		running, waiting int
	}{
		{"three quarters of its batch running", 0.1, 24, 0},
		{"a queue that fills three quarters", 0.1, 2, 22},
		{"KV past the pool's release threshold (0.95)", 0.96, 2, 0},
	} {
		e.now = e.now.Add(time.Second)
		e.beat("l70-batch-0", c.kv, c.running, c.waiting)
		d := e.decide(batch())
		if d.Err == nil || d.Err.Status != 503 || d.Err.Code != subjects.CodeAllReplicasBusy || d.Err.RetryAfter != policy.RetryBatchRoom {
			t.Errorf("%s: %s %s %v, want a 503 with Retry-After %v", c.name, d.Replica, d.Reason, d.Err, policy.RetryBatchRoom)
		}
	}
	e.now = e.now.Add(time.Second)
	e.beat("l70-batch-0", 0.1, 23, 0)
	if d := e.decide(batch()); d.Err != nil {
		t.Errorf("23 of 32 running: %v", d.Err)
	}
	// Two candidates: the one without room loses to the one with it.
	e.now = e.now.Add(time.Second)
	e.beat("l70-gen-0", 0.1, 30, 0)
	e.beat("l70-gen-1", 0.1, 2, 0)
	q := chat("chat-large")
	q.Priority, q.Conversation = subjects.PriorityBatch, "sticks-to-the-busy-one"
	e.retable(`{"policy": {"pool_rules": [{"when": "always", "pool": "general"}]}}`)
	for range 8 {
		d := e.decide(q)
		if d.Err != nil || d.Replica == "l70-gen-0" {
			t.Fatalf("batch work went to %s (%s, %v)", d.Replica, d.Reason, d.Err)
		}
	}
	q.Priority = subjects.PriorityInteractive
	if d := e.decide(q); d.Err != nil {
		t.Errorf("an interactive request: %v", d.Err)
	}
}

// TestBatchWorkFillsAPriorityEnginesBatch: on a replica whose engine
// schedules by priority, batch work may take every slot of its batch and a
// queue of a quarter of a batch behind it (an interactive request is
// admitted there before every waiting batch line), but not the rest of the
// queue, nor KV past the release threshold; a replica scheduling first
// come first served keeps a quarter of its batch free.
func TestBatchWorkFillsAPriorityEnginesBatch(t *testing.T) {
	e := newEnv(t)
	batch := func() *policy.Request { q := chat("chat-large"); q.Priority = subjects.PriorityBatch; return q }
	const prio = subjects.SchedulingPriority
	for _, c := range []struct {
		name             string
		scheduling       string
		kv               float64
		running, waiting int
		room             bool
	}{
		{"31 of 32 running, by priority", prio, 0.1, 31, 0, true},
		{"24 of 32 running, by priority", prio, 0.1, 24, 0, true},
		{"24 of 32 running, first come first served", "", 0.1, 24, 0, false},
		{"24 of 32 running, a policy brokers do not know", "lottery", 0.1, 24, 0, false},
		{"the batch full, by priority", prio, 0.1, 32, 0, true},
		{"the batch full and 7 waiting, by priority", prio, 0.1, 32, 7, true},
		{"the batch full and 8 waiting, by priority", prio, 0.1, 32, 8, false},
		{"the batch full, first come first served", "", 0.1, 32, 0, false},
		{"KV past the release threshold, by priority", prio, 0.96, 2, 0, false},
	} {
		e.now = e.now.Add(time.Second)
		e.beat("l70-batch-0", c.kv, c.running, c.waiting, func(hb *subjects.Heartbeat) { hb.Scheduling = c.scheduling })
		d := e.decide(batch())
		switch {
		case c.room && (d.Err != nil || d.Replica != "l70-batch-0"):
			t.Errorf("%s: %s %s %v, want it admitted", c.name, d.Replica, d.Reason, d.Err)
		case !c.room && (d.Err == nil || d.Err.Status != 503 || d.Err.RetryAfter != policy.RetryBatchRoom):
			t.Errorf("%s: %s %s %v, want a 503 with Retry-After %v", c.name, d.Replica, d.Reason, d.Err, policy.RetryBatchRoom)
		}
	}
}

// TestBatchRoomCountsTheLoadDelta: the adapter's load delta brings the
// in-flight count the batch room is judged by up to date, both ways: a
// replica whose heartbeat said full has room once its delta says requests
// ended, and one with room fills when its delta says they arrived.
func TestBatchRoomCountsTheLoadDelta(t *testing.T) {
	e := newEnv(t)
	q := chat("chat-large")
	q.Priority = subjects.PriorityBatch
	byPriority := func(h *subjects.Heartbeat) { h.Scheduling = subjects.SchedulingPriority }
	delta := func(hb, n uint64, inflight int) {
		t.Helper()
		if !e.r.ObserveLoadDelta(&subjects.LoadDelta{Replica: "l70-batch-0", Heartbeat: hb, Seq: n, Inflight: inflight,
			SentUnixMillis: e.now.UnixMilli()}, e.now) {
			t.Fatal("delta not applied")
		}
	}
	e.beat("l70-batch-0", 0.1, 32, 8, byPriority, seq(1, 40))
	if d := e.decide(q); d.Err == nil {
		t.Fatalf("a full hold (32 running, 8 waiting): admitted to %s", d.Replica)
	}
	delta(1, 1, 30)
	if d := e.decide(q); d.Err != nil || d.Replica != "l70-batch-0" {
		t.Errorf("ten ended since the full heartbeat: %s %v, want l70-batch-0", d.Replica, d.Err)
	}
	e.now = e.now.Add(time.Second)
	e.beat("l70-batch-0", 0.1, 20, 0, byPriority, seq(2, 20))
	delta(2, 1, 40)
	if d := e.decide(q); d.Err == nil {
		t.Errorf("twenty arrived since a heartbeat of 20: admitted to %s", d.Replica)
	}
}
