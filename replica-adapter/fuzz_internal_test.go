package adapter

import (
	"encoding/json"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/subjects"
)

// FuzzEngineHeaders feeds the adapter's engine call builder with arbitrary
// headers and bodies, as a compromised broker or a forged message could
// send them. Whatever comes in, the engine is called only on an endpoint
// Switchyard serves, with one answer asked for and the reserved
// max_tokens, or the request is a 400.
func FuzzEngineHeaders(f *testing.F) {
	a := &Adapter{cfg: Config{EngineURL: "http://engine:8000", EngineModel: "served"}}
	f.Add("/v1/chat/completions", "", "64", []byte(`{"model":"m","messages":[],"max_tokens":9999}`))
	f.Add("/v1/completions", "team-x", "1", []byte(`{"model":"m","prompt":"x","n":1}`))
	f.Add("/v1/embeddings", "", "", []byte(`{"model":"m","input":"x"}`))
	f.Add("/v1/unload_lora_adapter", "", "", []byte(`{"lora_name":"x"}`))
	f.Add("/v1/chat/completions", "", "1e9", []byte(`{"n":2}`))
	f.Add("/v1/chat/completions/../x", "", "-1", []byte(`{"mod\u0065l":1,"max_tokens":{"a":[1]}}`))
	f.Fuzz(func(t *testing.T, endpoint, lora, maxTokens string, body []byte) {
		h := nats.Header{subjects.HdrEndpoint: {endpoint}}
		if lora != "" {
			h.Set(subjects.HdrRouteLora, lora)
		}
		if maxTokens != "" {
			h.Set(subjects.HdrMaxTokens, maxTokens)
		}
		req, e := engineRequest(a, h, body)
		if e != nil {
			if e.Status != 400 {
				t.Fatalf("status %d", e.Status)
			}
			return
		}
		ep := answerLimits(endpoint)
		if !forwardable("", endpoint) || req.URL.String() != "http://engine:8000"+endpoint {
			t.Fatalf("engine called on %s for Llm-Endpoint %q", req.URL, endpoint)
		}
		sent, _ := io.ReadAll(req.Body)
		var top map[string]json.RawMessage
		if json.Unmarshal(sent, &top) != nil {
			return // the engine answers 400 to what it cannot parse
		}
		for _, k := range []string{"n", "best_of"} {
			if v, ok := top[k]; ok && ep.choices && string(v) != "1" && string(v) != "null" {
				t.Fatalf("engine asked for %s %s", k, v)
			}
		}
		if maxTokens != "" && len(ep.maxTokens) > 0 {
			n, _ := strconv.Atoi(maxTokens)
			for _, k := range ep.maxTokens {
				if v, ok := top[k]; ok && string(v) != strconv.Itoa(n) {
					t.Fatalf("engine got %s %s, reserved %d", k, v, n)
				}
			}
			if !strings.Contains(string(sent), `"max_tokens"`) && top["max_completion_tokens"] == nil {
				t.Fatalf("engine got no max_tokens: %s", sent)
			}
		}
	})
}
