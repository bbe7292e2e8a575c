package broker

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/deploy/examples"
	"github.com/switchyard-llm/switchyard/features"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// newTestBroker is a broker, not serving, whose deciding state holds the
// dev table plus n general replicas of llama-3-70b-instruct v1.5.0, each
// with a fresh heartbeat; setup may change its config first.
func newTestBroker(tb testing.TB, n int, now time.Time, setup ...func(nc *nats.Conn, cfg *Config)) *Broker {
	tb.Helper()
	_, url := natstest.Start(tb)
	nc, err := nats.Connect(url)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	cfg := Config{ID: "bench", Now: func() time.Time { return now }}
	for _, f := range setup {
		f(nc, &cfg)
	}
	b, err := New(nc, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(b.endLookups) // as stop does: no lookup goroutine outlives the test
	snap, errs := table.FromFlat(examples.Flat())
	if len(errs) > 0 {
		tb.Fatal(errs)
	}
	for i := range n {
		id := fmt.Sprintf("r-%d", i)
		v, err := table.Decode("replicas."+id, []byte(`{"model":"llama-3-70b-instruct","version":"v1.5.0","pool":"general","max_batch":32,"max_queue":128,"state":"ready"}`))
		if err != nil {
			tb.Fatal(err)
		}
		snap.Set(v, nil)
	}
	b.dec.SetTable(snap)
	for id, r := range snap.Replicas {
		b.Router().ObserveHeartbeat(&subjects.Heartbeat{
			Replica: id, Model: r.Model, Version: r.Version, Pool: r.Pool, State: subjects.StateReady,
			KVUsage: 0.3, Running: 4, Waiting: 1, MaxBatch: 32, MaxQueue: 128, ScrapeOK: true,
		}, now)
	}
	return b
}

// gatewayHeaders are the headers the gateway sets for a chat request with
// 32 prefix blocks.
func gatewayHeaders() nats.Header {
	prompt := make([]byte, 32*256)
	for i := range prompt {
		prompt[i] = byte('a' + i%26)
	}
	prefix := features.AppendPrefix(nil, prompt, 256, 64)
	return nats.Header{
		subjects.HdrRequestID:    {"req-1"},
		subjects.HdrModel:        {"chat-large"},
		subjects.HdrEndpoint:     {subjects.EndpointChat},
		subjects.HdrConversation: {"conv-42"},
		subjects.HdrPriority:     {subjects.PriorityInteractive},
		subjects.HdrPromptTokens: {strconv.Itoa(len(prompt) / 4)},
		subjects.HdrMaxTokens:    {"64"},
		subjects.HdrPrefix:       {features.FormatPrefixHeader(prefix)},
		subjects.HdrDeadline:     {"99999999999999"},
	}
}
