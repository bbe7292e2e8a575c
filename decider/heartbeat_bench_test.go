package decider

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/subjects"
)

// BenchmarkHeartbeat is the broker's cost of one heartbeat from a fleet of
// 1,000 replicas (decode, validate, load view, metrics). At one heartbeat
// per replica per second, 1,000 replicas cost 1,000 × this per second of
// one core.
func BenchmarkHeartbeat(b *testing.B) {
	now := time.Unix(1_800_000_000, 0)
	br := newTestBroker(b, 1000, now)
	msgs := make([]*nats.Msg, 1000)
	for i := range msgs {
		id := fmt.Sprintf("r-%d", i)
		data, _ := json.Marshal(subjects.Heartbeat{
			Replica: id, Model: "llama-3-70b-instruct", Version: "v1.5.0", Pool: "general", State: subjects.StateReady,
			KVUsage: 0.42, Running: 12, Waiting: 3, MaxBatch: 32, MaxQueue: 128, Inflight: 15,
			Lora: subjects.LoraState{Running: []string{"team-x-v3"}, Max: 4}, TTFTEWMAMillis: 41.5, QueueWaitMillis: 7.25,
			ScrapeOK: true, Seq: 12345, SentUnixMillis: now.UnixMilli(),
		})
		msgs[i] = &nats.Msg{Subject: "llm.heartbeat." + id, Data: data}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		br.onHeartbeat(msgs[i%len(msgs)])
	}
	b.StopTimer()
	perSecond := time.Duration(float64(b.Elapsed()) / float64(b.N) * 1000)
	b.ReportMetric(float64(perSecond)/float64(time.Second)*100, "%core@1000replicas")
}
