package decider

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/switchyard-llm/switchyard/subjects"
)

func deltaMsg(t testing.TB, subject string, d any) *nats.Msg {
	t.Helper()
	data, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return &nats.Msg{Subject: subject, Data: data}
}

// TestLoadDeltaTrust checks what a decider refuses to believe of a load
// delta (docs/security.md, "What each part checks"): a body speaking for
// another replica than its subject, numbers out of range, a replica not
// in the table. A delta believed shows in the load view and, for this
// decider's own predictions, in the TTFT error histogram.
func TestLoadDeltaTrust(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	b := newTestBroker(t, 2, now)
	// observed counts the TTFT errors this decider measured.
	observed := func() uint64 {
		var m dto.Metric
		if err := b.metrics.ttftError.Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetHistogram().GetSampleCount()
	}
	good := subjects.LoadDelta{Replica: "r-0", Heartbeat: 0, Seq: 1, Inflight: 3, QueuedPrefillTokens: 900,
		TTFT: []subjects.TTFTSample{{Broker: "bench", Predicted: 200, Observed: 450}, {Broker: "other", Predicted: 10, Observed: 20}}}

	t.Run("a delta for its own replica is believed, and only this decider's predictions are measured", func(t *testing.T) {
		before := observed()
		b.onLoad(deltaMsg(t, "llm.load.r-0", good))
		if got := observed() - before; got != 1 {
			t.Fatalf("%v TTFT errors observed, want this decider's one", got)
		}
	})

	t.Run("a delta naming another replica than its subject is refused", func(t *testing.T) {
		before, seen := testutil.ToFloat64(b.metrics.refused.WithLabelValues(refusedLoadReplica)), observed()
		forged := good
		forged.Seq = 2
		b.onLoad(deltaMsg(t, "llm.load.r-1", forged))
		if got := testutil.ToFloat64(b.metrics.refused.WithLabelValues(refusedLoadReplica)) - before; got != 1 {
			t.Errorf("refused %v, want 1", got)
		}
		if observed() != seen {
			t.Error("the forged delta's samples were believed")
		}
	})

	t.Run("an absurd delta is refused whole", func(t *testing.T) {
		many := make([]subjects.TTFTSample, subjects.MaxLoadDeltaTTFT+1)
		for i := range many {
			many[i] = subjects.TTFTSample{Broker: "bench", Predicted: 1, Observed: 1}
		}
		for i, d := range []any{
			map[string]any{"replica": "r-0", "seq": 10, "inflight": -1000000000},
			map[string]any{"replica": "r-0", "seq": 11, "inflight": 1 << 40},
			map[string]any{"replica": "r-0", "seq": 12, "queued_prefill_tokens": -1},
			map[string]any{"replica": "r-0", "seq": 13, "queued_prefill_tokens": 1e15},
			map[string]any{"replica": "r-0", "seq": 14, "ttft": many},
			map[string]any{"replica": "r-0", "seq": 15, "ttft": []map[string]any{{"broker": "bench", "predicted_ms": -1, "observed_ms": 5}}},
			map[string]any{"replica": "r-0", "seq": 16, "ttft": []map[string]any{{"broker": "bench", "predicted_ms": 5, "observed_ms": 1e300}}},
			map[string]any{"replica": "r-0", "seq": 17, "padding": strings.Repeat("x", subjects.MaxLoadDeltaBytes)},
			"not an object",
		} {
			bad, seen := testutil.ToFloat64(b.metrics.badMessages.WithLabelValues("load_delta")), observed()
			b.onLoad(deltaMsg(t, "llm.load.r-0", d))
			if got := testutil.ToFloat64(b.metrics.badMessages.WithLabelValues("load_delta")) - bad; got != 1 {
				t.Errorf("case %d: counted %v bad load deltas, want 1", i, got)
			}
			if observed() != seen {
				t.Errorf("case %d: an absurd delta's samples were believed", i)
			}
		}
	})

	t.Run("a replica not in the table is not heard", func(t *testing.T) {
		before := testutil.ToFloat64(b.metrics.refused.WithLabelValues(refusedReplica))
		ghost := good
		ghost.Replica = "ghost-0"
		b.onLoad(deltaMsg(t, "llm.load.ghost-0", ghost))
		if got := testutil.ToFloat64(b.metrics.refused.WithLabelValues(refusedReplica)) - before; got != 1 {
			t.Errorf("refused %v, want 1", got)
		}
	})
}

// BenchmarkLoadDelta is a decider's cost of one load delta from a fleet of
// 1,000 replicas (decode, validate, load view), without and with first
// tokens to compare with the predictions. An adapter sends at most one
// every subjects.LoadDeltaEvery, 20 a second: 1,000 replicas at that rate
// cost 20,000 × this per second of one core.
func BenchmarkLoadDelta(b *testing.B) {
	for _, samples := range []int{0, 2} {
		b.Run(fmt.Sprintf("ttft=%d", samples), func(b *testing.B) { benchLoadDelta(b, samples) })
	}
}

func benchLoadDelta(b *testing.B, samples int) {
	now := time.Unix(1_800_000_000, 0)
	br := newTestBroker(b, 1000, now)
	ttft := make([]subjects.TTFTSample, samples)
	for i := range ttft {
		ttft[i] = subjects.TTFTSample{Broker: "bench", Predicted: 412, Observed: 388.125}
	}
	// 32 rounds of the fleet, each delta newer than the last of its
	// replica: every one is applied (later rounds repeat, and are dropped
	// as old after the same decoding and checks).
	const rounds = 32
	msgs := make([]*nats.Msg, 0, 1000*rounds)
	for r := range rounds {
		for i := range 1000 {
			id := fmt.Sprintf("r-%d", i)
			msgs = append(msgs, deltaMsg(b, "llm.load."+id, subjects.LoadDelta{Replica: id, Seq: uint64(r + 1), Inflight: 14,
				QueuedPrefillTokens: 12345, TTFT: ttft, SentUnixMillis: now.UnixMilli()}))
		}
	}
	perSecond := int(time.Second / subjects.LoadDeltaEvery)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		br.onLoad(msgs[i%len(msgs)])
	}
	b.StopTimer()
	cost := time.Duration(float64(b.Elapsed()) / float64(b.N) * float64(1000*perSecond))
	b.ReportMetric(float64(cost)/float64(time.Second)*100, "%core@1000replicas")
}
