package adapter_test

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	"github.com/switchyard-llm/switchyard/subjects"
)

// TestClientsSeeThePublicName: the engine answers with the name it serves
// under (a LoRA adapter, or --engine-model); the body and every stream chunk
// carry the name the client asked for instead.
func TestClientsSeeThePublicName(t *testing.T) {
	e := newEnv(t)
	e.start(e.config())
	e.waitReady("r-1")

	e.eng.handle(streamSSE(t))
	h := chatHeaders("stream-lora")
	h.Set(subjects.HdrModel, "chat-small:team-x-v3")
	h.Set(subjects.HdrRouteLora, "lora-a")
	var body bytes.Buffer
	for _, m := range untilEnd(t, e.request("r-1", h, `{"model":"chat-small:team-x-v3","stream":true}`)) {
		body.Write(m.Data)
	}
	if n := strings.Count(body.String(), `"model":"chat-small:team-x-v3"`); n < 3 || strings.Contains(body.String(), `"lora-a"`) {
		t.Fatalf("stream names the model %d times publicly; body:\n%s", n, body.String())
	}
	if got := e.eng.requests()[0].Body["model"]; got != "lora-a" {
		t.Fatalf("engine was asked for %v, want its adapter name", got)
	}

	e.eng.handle(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(golden(t, "vllm/chat-completion.json"))
	})
	h = chatHeaders("whole")
	h.Del(subjects.HdrStream)
	h.Set(subjects.HdrModel, "chat-small")
	msgs := untilEnd(t, e.request("r-1", h, `{"model":"chat-small"}`))
	if b := string(msgs[len(msgs)-1].Data); !strings.Contains(b, `"model": "chat-small"`) || strings.Contains(b, "sim-model") {
		t.Fatalf("body %s", b)
	}
}
