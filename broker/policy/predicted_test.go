package policy_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/features"
	"github.com/switchyard-llm/switchyard/subjects"
)

const predictedTTFT = `{"policy": {"replica_choice": "predicted-ttft", "allow_anonymous": true}}`

// prefill sets a heartbeat's prefill view: rate in tokens/s, queued
// prompt tokens, and a 50 ms base TTFT (EWMA 50, queue wait 0).
func prefill(rate float64, queued int) func(*subjects.Heartbeat) {
	return func(h *subjects.Heartbeat) {
		h.PrefillTokensPerSec, h.QueuedPrefillTokens = rate, queued
		h.TTFTEWMAMillis, h.QueueWaitMillis = 50, 0
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-6 }

func TestPredictedTTFTChoosesTheLowestPrediction(t *testing.T) {
	e := newEnv(t, predictedTTFT)
	// l8-gen-0 has 10 s of prefill queued; its load_score is the lower.
	e.beat("l8-gen-0", 0.1, 0, 0, prefill(1000, 10000))
	e.beat("l8-gen-1", 0.5, 8, 0, prefill(1000, 0))
	q := chat("chat-small")
	q.PromptTokens = 400
	d := e.explain(q)
	mustRoute(t, d)
	if d.Replica != "l8-gen-1" || d.Reason != policy.ReasonPredicted {
		t.Fatalf("%s (%s), want l8-gen-1 by predicted-ttft", d.Replica, d.Reason)
	}
	// 50 ms base + 400 tokens at 1 token/ms.
	if !near(d.PredictedTTFT, 450) {
		t.Fatalf("predicted %v ms, want 450", d.PredictedTTFT)
	}
	a := d.Alternatives()
	if len(a) != 1 || a[0].Why != policy.WhyHigherTTFT || !near(a[0].PredictedTTFTMillis, 10450) {
		t.Fatalf("alternatives %+v, want l8-gen-0 at 10450 ms", a)
	}
	if w := d.Wire(q); !near(w.PredictedTTFTMillis, 450) {
		t.Fatalf("wire predicted_ttft_ms %v", w.PredictedTTFTMillis)
	}
}

func TestPredictedTTFTDefaultIsPowerOfTwo(t *testing.T) {
	e := newEnv(t)
	e.beat("l8-gen-0", 0.1, 0, 0, prefill(1000, 10000))
	e.beat("l8-gen-1", 0.5, 8, 0, prefill(1000, 0))
	if d := e.explain(chat("chat-small")); d.Reason == policy.ReasonPredicted || d.Replica != "l8-gen-0" {
		t.Fatalf("%s (%s), want power of two's l8-gen-0", d.Replica, d.Reason)
	}
}

func TestPredictedTTFTCachedBlocksCostNothing(t *testing.T) {
	prompt := []byte(strings.Repeat("You are a helpful assistant. ", 300))
	blocks := features.AppendPrefix(nil, prompt, 256, 32) // 32 blocks of 64 tokens
	e := newEnv(t, predictedTTFT)
	e.r.ObservePlacement(&subjects.Placement{Model: "llama-3-8b-instruct", Replica: "l8-gen-0", Blocks: blocks})
	// The holder has 200 tokens queued; the other none. Without the
	// prefix the holder's 2048 + 200 tokens lose to 2048. Below the
	// release threshold prefix affinity keeps the holder, and predicts it
	// with its blocks cached.
	e.beat("l8-gen-0", 0.1, 0, 0, prefill(1000, 200))
	e.beat("l8-gen-1", 0.1, 0, 0, prefill(1000, 0))
	q := chat("chat-small")
	q.PromptTokens, q.Prefix = 2048, blocks
	d := e.explain(q)
	mustRoute(t, d)
	if d.Replica != "l8-gen-0" || d.Reason != policy.ReasonPrefix || d.PrefixMatched != 32 || !near(d.PredictedTTFT, 250) {
		t.Fatalf("%s (%s), matched %d, predicted %v ms; want the holder, 32 blocks, 250 ms", d.Replica, d.Reason, d.PrefixMatched, d.PredictedTTFT)
	}
	q.Prefix = nil
	if d = e.explain(q); d.Replica != "l8-gen-1" {
		t.Fatalf("without a prefix %s (%s), want l8-gen-1", d.Replica, d.Reason)
	}
}

func TestPredictedTTFTCountsWhatThisBrokerSent(t *testing.T) {
	e := newEnv(t, predictedTTFT)
	e.beat("l8-gen-0", 0.1, 0, 0, prefill(1000, 0))
	e.beat("l8-gen-1", 0.1, 0, 0, prefill(1000, 0))
	q := chat("chat-small")
	q.PromptTokens = 5000
	first := e.decide(q)
	mustRoute(t, first)
	second := e.decide(q)
	mustRoute(t, second)
	if second.Replica == first.Replica || !near(second.PredictedTTFT, 5050) {
		t.Fatalf("second request to %s at %v ms after the first to %s: the first's prefill was not counted",
			second.Replica, second.PredictedTTFT, first.Replica)
	}
	// A heartbeat replaces what this broker sent with what the replica reports.
	e.beat(first.Replica, 0.1, 0, 0, prefill(1000, 0))
	e.beat(second.Replica, 0.1, 0, 0, prefill(1000, 0))
	if d := e.explain(q); !near(d.PredictedTTFT, 5050) {
		t.Fatalf("after the heartbeats %v ms, want 5050", d.PredictedTTFT)
	}
}

// The deadline check and the objective check read the same prediction.
func TestPredictionAnswersTheDeadline(t *testing.T) {
	e := newEnv(t)
	e.beat("l8-gen-0", 0.1, 0, 0, prefill(1000, 10000))
	e.beat("l8-gen-1", 0.1, 0, 0, prefill(1000, 9000))
	q := chat("chat-small")
	q.Deadline = t0.Add(time.Second)
	d := e.decide(q)
	mustReject(t, d, 503, subjects.CodeDeadlineUnmeetable)
	// The fastest: 50 + 9000 + 100 = 9150 ms, 8.15 s past the deadline.
	if d.Err.RetryAfter != 8150*time.Millisecond {
		t.Fatalf("RetryAfter %v, want 8.15s", d.Err.RetryAfter)
	}
	q.Deadline, q.TTFTObjective = time.Time{}, 9200*time.Millisecond
	d = e.decide(q)
	mustRoute(t, d)
	if d.Replica != "l8-gen-1" {
		t.Fatalf("%s (%s), want l8-gen-1, the one that meets 9.2s", d.Replica, d.Reason)
	}
}
