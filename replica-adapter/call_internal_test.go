package adapter

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/subjects"
)

// BenchmarkEngineCall is one streamed chat's engine call: the request
// built, the engine's answer (a captured vLLM stream, an event a write)
// relayed read by read on an embedded server, the usage settled, and the
// model renamed to the name the client asked for.
func BenchmarkEngineCall(b *testing.B) {
	answer, err := os.ReadFile("testdata/vllm/chat-stream-lora.sse")
	if err != nil {
		b.Fatal(err)
	}
	events := bytes.SplitAfter(answer, []byte("\n\n"))
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range events {
			_, _ = w.Write(ev)
			w.(http.Flusher).Flush()
		}
	}))
	defer eng.Close()
	_, url := natstest.Start(b)
	nc, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	a, err := New(nc, Config{Replica: "r-0", Model: "chat-small", EngineURL: eng.URL})
	if err != nil {
		b.Fatal(err)
	}
	h := nats.Header{subjects.HdrEndpoint: {subjects.EndpointChat}, subjects.HdrModel: {"chat-small:team-x-v3"},
		subjects.HdrRouteLora: {"lora-a"}, subjects.HdrPromptTokens: {"12"}, subjects.HdrMaxTokens: {"64"}}
	body := []byte(`{"model":"chat-small:team-x-v3","messages":[{"role":"user","content":"hello"}],"stream":true}`)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		st := &stream{nc: nc, reply: "llm.reply.gw.bench", next: 1}
		c := &engineCall{a: a, ctx: ctx, st: st, h: h, body: body, lora: true, rename: renaming(a.servedModel(h), h.Get(subjects.HdrModel))}
		if t := c.run(); t.CompletionTokens == 0 {
			b.Fatalf("no tokens settled: %+v", t)
		}
	}
}
