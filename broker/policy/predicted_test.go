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

// newSampledEnv is newEnv with another decider live: predicted-ttft then
// weighs the prefix holders and a sampled pair by each replica's own
// prediction (the tests below). A decider alone chooses over every
// replica by prefill work (TestPredictedAlone…).
func newSampledEnv(t testing.TB, extra ...string) *env {
	e := newEnv(t, extra...)
	e.r.SetLiveBrokers(2)
	return e
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-6 }

func TestPredictedTTFTChoosesTheLowestPrediction(t *testing.T) {
	e := newSampledEnv(t, predictedTTFT)
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

// Predictions within a quarter of each other are a tie: load_score
// decides, as power of two would.
func TestPredictedTTFTCloseCallsGoByLoad(t *testing.T) {
	e := newSampledEnv(t, predictedTTFT)
	// 450 ms against 550 ms: within a quarter; l8-gen-1's load is lower.
	e.beat("l8-gen-0", 0.1, 8, 0, prefill(1000, 0))
	e.beat("l8-gen-1", 0.1, 0, 0, prefill(1000, 100))
	q := chat("chat-small")
	q.PromptTokens = 400
	if d := e.explain(q); d.Replica != "l8-gen-1" || d.Reason != policy.ReasonPredicted {
		t.Fatalf("%s (%s), want the less loaded l8-gen-1", d.Replica, d.Reason)
	}
	// 450 ms against 1450 ms: the prediction decides.
	e.beat("l8-gen-1", 0.1, 0, 0, prefill(1000, 1000))
	if d := e.explain(q); d.Replica != "l8-gen-0" {
		t.Fatalf("%s (%s), want l8-gen-0, the faster by far", d.Replica, d.Reason)
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
	e := newSampledEnv(t, predictedTTFT)
	e.r.ObservePlacement(&subjects.Placement{Model: "llama-3-8b-instruct", Replica: "l8-gen-0", Blocks: blocks})
	// The holder has 4000 tokens queued; the other none. Without the
	// prefix the holder's 2048 + 4000 tokens lose to 2048. Below the
	// release threshold prefix affinity keeps the holder, and predicts it
	// with its blocks cached.
	e.beat("l8-gen-0", 0.1, 0, 0, prefill(1000, 4000))
	e.beat("l8-gen-1", 0.1, 0, 0, prefill(1000, 0))
	q := chat("chat-small")
	q.PromptTokens, q.Prefix = 2048, blocks
	d := e.explain(q)
	mustRoute(t, d)
	if d.Replica != "l8-gen-0" || d.Reason != policy.ReasonPrefix || d.PrefixMatched != 32 || !near(d.PredictedTTFT, 4050) {
		t.Fatalf("%s (%s), matched %d, predicted %v ms; want the holder, 32 blocks, 4050 ms", d.Replica, d.Reason, d.PrefixMatched, d.PredictedTTFT)
	}
	q.Prefix = nil
	if d = e.explain(q); d.Replica != "l8-gen-1" {
		t.Fatalf("without a prefix %s (%s), want l8-gen-1", d.Replica, d.Reason)
	}
}

func TestPredictedTTFTCountsWhatThisBrokerSent(t *testing.T) {
	e := newSampledEnv(t, predictedTTFT)
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

// decode sets a heartbeat's decode time in ms.
func decode(ms float64) func(*subjects.Heartbeat) {
	return func(h *subjects.Heartbeat) { h.DecodeMillis = ms }
}

// With a full batch a request waits for a running one to end: a slot
// frees every decode_ms / max_batch, and the prediction counts the slots
// it waits for, itself included.
func TestPredictedTTFTCountsTheWaitForABatchSlot(t *testing.T) {
	e := newSampledEnv(t, predictedTTFT)
	// l8-gen-0: 2 waiting behind a full batch of 32, a slot every 1000 ms:
	// 3 slots, 3000 ms. l8-gen-1: 10 waiting (the higher load_score), a
	// slot every 10 ms: 11 slots, 110 ms.
	e.beat("l8-gen-0", 0.1, 32, 2, prefill(1000, 0), decode(32000))
	e.beat("l8-gen-1", 0.1, 32, 10, prefill(1000, 0), decode(320))
	q := chat("chat-small")
	q.PromptTokens = 400
	d := e.explain(q)
	mustRoute(t, d)
	if d.Replica != "l8-gen-1" || d.Reason != policy.ReasonPredicted || !near(d.PredictedTTFT, 50+400+110) {
		t.Fatalf("%s (%s) at %v ms, want l8-gen-1 at 560 ms", d.Replica, d.Reason, d.PredictedTTFT)
	}
	if a := d.Alternatives(); len(a) != 1 || !near(a[0].PredictedTTFTMillis, 50+400+3000) {
		t.Fatalf("alternatives %+v, want l8-gen-0 at 3450 ms", a)
	}
	// A batch with room waits for no slot, whatever its decode time.
	e.beat("l8-gen-0", 0.1, 31, 0, prefill(1000, 0), decode(32000))
	if d = e.explain(q); d.Replica != "l8-gen-0" || !near(d.PredictedTTFT, 450) {
		t.Fatalf("%s at %v ms, want l8-gen-0 with room at 450 ms", d.Replica, d.PredictedTTFT)
	}
	// The deadline check reads the same prediction.
	e.beat("l8-gen-0", 0.1, 32, 2, prefill(1000, 0), decode(32000))
	e.beat("l8-gen-1", 0.1, 32, 10, prefill(1000, 0), decode(32000))
	q.Deadline = t0.Add(time.Second)
	mustReject(t, e.decide(q), 503, subjects.CodeDeadlineUnmeetable)
}

// At an engine scheduling by priority, the batch lines waiting there are
// admitted after an interactive request: its wait for a slot counts only
// the interactive requests waiting. Elsewhere, or said by a replica that
// does not schedule by priority, every waiting request counts.
func TestPredictedTTFTLeavesWaitingBatchLinesOut(t *testing.T) {
	batchWaiting := func(n int, scheduling string) func(*subjects.Heartbeat) {
		return func(h *subjects.Heartbeat) { h.BatchWaiting, h.Scheduling = n, scheduling }
	}
	for _, tt := range []struct {
		name       string
		scheduling string
		want       float64
	}{
		// 8 waiting behind a full batch of 32, 6 of them batch lines: the
		// request waits for 3 slots, one every 100 ms.
		{"priority", subjects.SchedulingPriority, 50 + 400 + 300},
		{"first come, first served", "", 50 + 400 + 900},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newSampledEnv(t, predictedTTFT)
			e.beat("l8-gen-0", 0.1, 32, 8, prefill(1000, 0), decode(3200), batchWaiting(6, tt.scheduling))
			e.beat("l8-gen-1", 0.1, 32, 60, prefill(1000, 0), decode(3200))
			q := chat("chat-small")
			q.PromptTokens = 400
			d := e.explain(q)
			mustRoute(t, d)
			if d.Replica != "l8-gen-0" || !near(d.PredictedTTFT, tt.want) {
				t.Fatalf("%s at %v ms, want l8-gen-0 at %v ms", d.Replica, d.PredictedTTFT, tt.want)
			}
		})
	}
}

// Among the holders of a prefix, predicted-ttft sends the request to the
// one with the shorter predicted TTFT, not the lighter load_score: a prefix
// held by two replicas splits its requests by their queues.
func TestPredictedTTFTWeighsThePrefixHolders(t *testing.T) {
	prompt := []byte(strings.Repeat("You are a helpful assistant. ", 300))
	blocks := features.AppendPrefix(nil, prompt, 256, 32)
	for _, tt := range []struct {
		name, table, want string
	}{
		{"power of two: the lighter load_score", `{}`, "l8-gen-0"},
		{"predicted-ttft: the shorter queue", predictedTTFT, "l8-gen-1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newSampledEnv(t, tt.table)
			for _, id := range []string{"l8-gen-0", "l8-gen-1"} {
				e.r.ObservePlacement(&subjects.Placement{Model: "llama-3-8b-instruct", Replica: id, Blocks: blocks})
			}
			e.beat("l8-gen-0", 0.2, 0, 0, prefill(1000, 5000))
			e.beat("l8-gen-1", 0.4, 0, 0, prefill(1000, 0))
			q := chat("chat-small")
			q.PromptTokens, q.Prefix = 2048, blocks
			d := e.explain(q)
			mustRoute(t, d)
			if d.Replica != tt.want || d.Reason != policy.ReasonPrefix || d.PrefixMatched != 32 {
				t.Fatalf("%s (%s), matched %d; want %s by prefix affinity", d.Replica, d.Reason, d.PrefixMatched, tt.want)
			}
		})
	}
}

// With predicted-ttft, a warm replica the exact index (kv-events) names is
// weighed against the power-of-two pair, as the lab's oracle places: it
// keeps a request while the queue there costs clearly less than the
// prefill its cache saves, loses it once the queue costs more, and, the
// two within predictedTie of each other, goes by load_score as every
// predicted-ttft choice does. A holder named by placements, a guess, keeps
// it either way.
func TestPredictedTTFTWeighsAnExactHolderAgainstThePair(t *testing.T) {
	const model = "llama-3-8b-instruct"
	prompt := []byte(strings.Repeat("You are a helpful assistant. ", 300))
	blocks := features.AppendPrefix(nil, prompt, 256, 32) // 32 blocks of 64 tokens
	feed := func(hb *subjects.Heartbeat) { hb.KVEvents, hb.KVBlocks, hb.BlockSize = true, 1000, 64 }
	q := chat("chat-small")
	q.PromptTokens, q.Prefix = 2048, blocks
	// The cold replica costs 50 + 2048 ms to its first token and 2048 ms
	// its prefill holds up there: 4146 ms.
	for _, c := range []struct {
		name   string
		queued int
		kv     float64 // the holder's, against the other's 0.1
		exact  bool
		want   string
		reason string
		why    string // the holder's alternative, when it lost
	}{
		{"a short queue at the holder", 1000, 0.1, true, "l8-gen-0", policy.ReasonPrefix, ""},
		// 3850 against 4146 ms: a tie, and the holder is heavier: it
		// lost on load_score, and its alternative says so.
		{"a holder a little cheaper and heavier", 3800, 0.5, true, "l8-gen-1", policy.ReasonPredicted, policy.WhyHigherLoad},
		{"a holder a little cheaper and lighter", 3800, 0.05, true, "l8-gen-0", policy.ReasonPrefix, ""},
		{"a long queue at the holder", 8000, 0.1, true, "l8-gen-1", policy.ReasonPredicted, policy.WhyHigherTTFT},
		{"a long queue at a placements holder", 8000, 0.1, false, "l8-gen-0", policy.ReasonPrefix, ""},
	} {
		e := newSampledEnv(t, predictedTTFT)
		if c.exact {
			e.beat("l8-gen-0", c.kv, 0, 0, prefill(1000, c.queued), feed)
			if err := e.r.ObserveKV(&subjects.KVUpdate{Replica: "l8-gen-0", Model: model, Seq: 1, Reset: true, KVBlocks: 1000, Stored: blocks}); err != nil {
				t.Fatal(err)
			}
		} else {
			e.beat("l8-gen-0", c.kv, 0, 0, prefill(1000, c.queued))
			e.r.ObservePlacement(&subjects.Placement{Model: model, Replica: "l8-gen-0", Blocks: blocks})
		}
		e.beat("l8-gen-1", 0.1, 0, 0, prefill(1000, 0), feed)
		d := e.explain(q)
		mustRoute(t, d)
		if d.Replica != c.want || d.Reason != c.reason {
			t.Errorf("%s: %s (%s), want %s (%s)", c.name, d.Replica, d.Reason, c.want, c.reason)
		}
		if c.why != "" {
			if a := d.Alternatives(); len(a) != 1 || a[0].Why != c.why {
				t.Errorf("%s: alternatives %+v, want l8-gen-0 lost for %q", c.name, a, c.why)
			}
		}
	}
}

// fourReplicas adds l8-gen-2 and l8-gen-3 to the dev table's two general
// replicas of llama-3-8b-instruct.
const fourReplicas = `{"replicas.l8-gen-2": {"model": "llama-3-8b-instruct", "version": "v1.0.0", "pool": "general", "state": "ready"},
	"replicas.l8-gen-3": {"model": "llama-3-8b-instruct", "version": "v1.0.0", "pool": "general", "state": "ready"}}`

// promptOf2048 is a prefix of 32 blocks of 64 tokens and a chat request
// of 2 048 prompt tokens carrying it.
func promptOf2048() ([]uint64, func() *policy.Request) {
	prompt := []byte(strings.Repeat("You are a helpful assistant. ", 300))
	blocks := features.AppendPrefix(nil, prompt, 256, 32)
	return blocks, func() *policy.Request {
		q := chat("chat-small")
		q.PromptTokens, q.Prefix = 2048, blocks
		return q
	}
}

// kvFeed marks a heartbeat's replica as one whose adapter sends the
// engine's KV events.
func kvFeed(hb *subjects.Heartbeat) { hb.KVEvents, hb.KVBlocks, hb.BlockSize = true, 1000, 64 }

// holds tells e's exact index that replica's engine holds blocks.
func holds(t *testing.T, e *env, replica string, blocks []uint64) {
	t.Helper()
	if err := e.r.ObserveKV(&subjects.KVUpdate{Replica: replica, Model: "llama-3-8b-instruct", Seq: 1, Reset: true, KVBlocks: 1000, Stored: blocks}); err != nil {
		t.Fatal(err)
	}
}

// A decider alone that reads the KV-event feed chooses over every replica
// for a request with a prefix: the least prefill work
// ahead, here the replica with the highest load_score, every time. With
// another decider live it samples, and the others get some of the
// requests.
func TestPredictedAloneChoosesTheLeastWorkOfAll(t *testing.T) {
	_, req := promptOf2048() // a prefix no replica holds
	counts := func(e *env) map[string]int {
		for i, id := range []string{"l8-gen-0", "l8-gen-1", "l8-gen-2", "l8-gen-3"} {
			// l8-gen-3: the least prefill queued, the most running.
			e.beat(id, 0.1, 2+4*i, 0, prefill(1000, 3000-1000*i), kvFeed)
		}
		holds(t, e, "l8-gen-0", []uint64{42}) // the exact index is live
		got := map[string]int{}
		for range 200 {
			d := e.explain(req())
			mustRoute(t, d)
			got[d.Replica]++
			if d.Reason != policy.ReasonPredicted {
				t.Fatalf("%s (%s), want predicted-ttft", d.Replica, d.Reason)
			}
		}
		return got
	}
	e := newEnv(t, predictedTTFT, fourReplicas)
	if got := counts(e); got["l8-gen-3"] != 200 {
		t.Fatalf("alone: %v, want every request on l8-gen-3", got)
	}
	for _, a := range e.explain(req()).Alternatives() {
		if a.Why != policy.WhyMoreWork {
			t.Fatalf("alternative %s lost for %q, want %q", a.Replica, a.Why, policy.WhyMoreWork)
		}
	}
	if got := counts(newSampledEnv(t, predictedTTFT, fourReplicas)); got["l8-gen-3"] == 200 {
		t.Fatalf("with another decider: %v, want the sampled pair to spread them", got)
	}
}

// Alone, reading the feed, a replica holding at least 65% of the request's prefix keeps it
// until the lightest replica has 286 704 prompt tokens (llm-d's 18 s at
// 15 928 tokens/s) less work; a replica holding less is not sticky but
// its blocks still cost nothing.
func TestPredictedAloneKeepsAPrefixOnItsHolders(t *testing.T) {
	blocks, req := promptOf2048()
	setup := func(holderQueued int) *env {
		e := newEnv(t, predictedTTFT, fourReplicas)
		e.beat("l8-gen-0", 0.1, 0, 0, prefill(1000, holderQueued), kvFeed)
		holds(t, e, "l8-gen-0", blocks)
		for _, id := range []string{"l8-gen-1", "l8-gen-2", "l8-gen-3"} {
			e.beat(id, 0.1, 0, 0, prefill(1000, 0), kvFeed)
		}
		return e
	}

	d := setup(200000).explain(req())
	mustRoute(t, d)
	if d.Replica != "l8-gen-0" || d.Reason != policy.ReasonPredicted || d.PrefixMatched != 32 || d.PrefixSource != policy.PrefixKVEvents {
		t.Fatalf("200 000 tokens queued at the holder: %s (%s) matched %d from %q, want l8-gen-0 with 32 blocks from the KV events",
			d.Replica, d.Reason, d.PrefixMatched, d.PrefixSource)
	}
	for _, a := range d.Alternatives() {
		if a.Why != policy.WhyNotSticky {
			t.Fatalf("alternative %s lost for %q, want %q", a.Replica, a.Why, policy.WhyNotSticky)
		}
	}

	d = setup(300000).explain(req())
	mustRoute(t, d)
	if d.Replica == "l8-gen-0" || d.PrefixMatched != 0 {
		t.Fatalf("300 000 tokens queued at the holder: %s matched %d, want another replica", d.Replica, d.PrefixMatched)
	}
	var why string
	for _, a := range d.Alternatives() {
		if a.Replica == "l8-gen-0" {
			why = a.Why
		}
	}
	if why != policy.WhyOutweighed {
		t.Fatalf("the released holder lost for %q, want %q", why, policy.WhyOutweighed)
	}

	// A holder at capacity (its batch and queue full) is a candidate like
	// any other: 3 000 tokens queued there lose to 2 048 uncached
	// elsewhere.
	e := setup(3000)
	e.beat("l8-gen-0", 0.5, 32, 128, prefill(1000, 3000), kvFeed)
	if d = e.explain(req()); d.Replica == "l8-gen-0" {
		t.Fatalf("a full holder: %s, want another replica", d.Replica)
	}
	e.beat("l8-gen-0", 0.5, 32, 0, prefill(1000, 3000), kvFeed)
	if d = e.explain(req()); d.Replica != "l8-gen-0" {
		t.Fatalf("the holder with room in its queue: %s, want it", d.Replica)
	}

	// Half the prefix (1 024 of 2 048 tokens cached) is below the
	// threshold, but credited: 1 000 queued + 1 024 uncached beats 2 048.
	e = newEnv(t, predictedTTFT, fourReplicas)
	e.beat("l8-gen-1", 0.1, 0, 0, prefill(1000, 1000), kvFeed)
	holds(t, e, "l8-gen-1", blocks[:16])
	for _, id := range []string{"l8-gen-0", "l8-gen-2", "l8-gen-3"} {
		e.beat(id, 0.1, 0, 0, prefill(1000, 0), kvFeed)
	}
	if d = e.explain(req()); d.Replica != "l8-gen-1" || d.PrefixMatched != 16 {
		t.Fatalf("half the prefix held: %s matched %d, want l8-gen-1 with 16 blocks", d.Replica, d.PrefixMatched)
	}
	// From placements alone the sampled choice stays: prefix affinity
	// keeps the holder below the release threshold.
	e = newEnv(t, predictedTTFT, fourReplicas)
	e.r.ObservePlacement(&subjects.Placement{Model: "llama-3-8b-instruct", Replica: "l8-gen-1", Blocks: blocks})
	e.beat("l8-gen-1", 0.1, 0, 0, prefill(1000, 1000))
	for _, id := range []string{"l8-gen-0", "l8-gen-2", "l8-gen-3"} {
		e.beat(id, 0.1, 0, 0, prefill(1000, 0))
	}
	if d = e.explain(req()); d.Replica != "l8-gen-1" || d.Reason != policy.ReasonPrefix {
		t.Fatalf("from placements: %s (%s), want l8-gen-1 by prefix affinity", d.Replica, d.Reason)
	}
}

// Alone, equal work goes to the lower load_score, and among equals at
// random.
func TestPredictedAloneTiesGoByLoadThenAtRandom(t *testing.T) {
	_, req := promptOf2048() // a prefix no replica holds
	e := newEnv(t, predictedTTFT, fourReplicas)
	for i, id := range []string{"l8-gen-0", "l8-gen-1", "l8-gen-2", "l8-gen-3"} {
		e.beat(id, 0.1+0.1*float64(i), 0, 0, prefill(1000, 0), kvFeed)
	}
	holds(t, e, "l8-gen-0", []uint64{42})
	for range 50 {
		d := e.explain(req())
		if d.Replica != "l8-gen-0" || d.Reason != policy.ReasonPredicted {
			t.Fatalf("%s (%s), want l8-gen-0, the lowest load_score, by predicted-ttft", d.Replica, d.Reason)
		}
		for _, a := range d.Alternatives() {
			if a.Why != policy.WhyHigherLoad {
				t.Fatalf("alternative %s lost for %q, want %q (as much work)", a.Replica, a.Why, policy.WhyHigherLoad)
			}
		}
	}
	for _, id := range []string{"l8-gen-0", "l8-gen-1", "l8-gen-2", "l8-gen-3"} {
		e.beat(id, 0.1, 0, 0, prefill(1000, 0), kvFeed)
	}
	got := map[string]int{}
	for range 200 {
		got[e.explain(req()).Replica]++
	}
	if len(got) != 4 {
		t.Fatalf("equal replicas: %v, want all four chosen", got)
	}
}

// Alone, reading the feed, what this decider sent a replica and its engine
// has not reported stored is held there: a request queued there will find
// its blocks cached. The sampled choice of a decider with another live
// does not read them; after a reset of the replica's feed they are gone;
// once stored, the exact index holds them.
func TestPredictedAloneCountsWhatItSentAndTheEngineHasNotStored(t *testing.T) {
	blocks, req := promptOf2048()
	e := newEnv(t, predictedTTFT, fourReplicas)
	ids := []string{"l8-gen-0", "l8-gen-1", "l8-gen-2", "l8-gen-3"}
	for i, id := range ids {
		e.beat(id, 0.1, 0, 0, prefill(1000, 1000+500*i), kvFeed)
		// Every replica's feed is live and its engine holds something else.
		if err := e.r.ObserveKV(&subjects.KVUpdate{Replica: id, Model: "llama-3-8b-instruct", Seq: 1, Reset: true, KVBlocks: 1000, Stored: []uint64{uint64(100 + i)}}); err != nil {
			t.Fatal(err)
		}
	}
	d := e.decide(req())
	mustRoute(t, d)
	if d.Replica != "l8-gen-0" || d.PrefixMatched != 0 {
		t.Fatalf("first request: %s matched %d, want l8-gen-0 (the least work) with nothing held", d.Replica, d.PrefixMatched)
	}
	// Its heartbeat now counts the request queued: 1 000 + 2 048 tokens
	// ahead there, against 1 500 + 2 048 at the next replica; sent, not
	// stored, its blocks cost nothing.
	e.beat("l8-gen-0", 0.1, 0, 0, prefill(1000, 3048), kvFeed)
	d = e.explain(req())
	mustRoute(t, d)
	if d.Replica != "l8-gen-0" || d.PrefixMatched != len(blocks) || d.Reason != policy.ReasonPredicted {
		t.Fatalf("the blocks sent, not stored: %s (%s) matched %d, want l8-gen-0 holding all %d", d.Replica, d.Reason, d.PrefixMatched, len(blocks))
	}

	// With another decider live the sampled choice reads only the feed for
	// such a replica: the blocks sent are not held.
	e.r.SetLiveBrokers(2)
	for range 20 {
		if d = e.explain(req()); d.PrefixMatched != 0 {
			t.Fatalf("sampled: %s matched %d, want nothing held", d.Replica, d.PrefixMatched)
		}
	}
	e.r.SetLiveBrokers(1)

	// The engine restarted (a reset, not a resend): what was queued is
	// lost, and the blocks are held nowhere.
	if err := e.r.ObserveKV(&subjects.KVUpdate{Replica: "l8-gen-0", Model: "llama-3-8b-instruct", Seq: 1, Reset: true, KVBlocks: 1000}); err != nil {
		t.Fatal(err)
	}
	d = e.explain(req())
	mustRoute(t, d)
	if d.Replica != "l8-gen-1" || d.PrefixMatched != 0 {
		t.Fatalf("after a reset: %s matched %d, want l8-gen-1 with nothing held", d.Replica, d.PrefixMatched)
	}

	// Stored: the exact index holds them.
	if err := e.r.ObserveKV(&subjects.KVUpdate{Replica: "l8-gen-0", Model: "llama-3-8b-instruct", Seq: 2, KVBlocks: 1000, Stored: blocks}); err != nil {
		t.Fatal(err)
	}
	d = e.explain(req())
	mustRoute(t, d)
	if d.Replica != "l8-gen-0" || d.PrefixMatched != len(blocks) || d.PrefixSource != policy.PrefixKVEvents {
		t.Fatalf("the blocks stored: %s matched %d from %q, want l8-gen-0 holding all from the KV events", d.Replica, d.PrefixMatched, d.PrefixSource)
	}
}
