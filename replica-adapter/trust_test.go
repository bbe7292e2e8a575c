package adapter_test

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/switchyard-llm/switchyard/subjects"
)

// TestTrust checks what the adapter refuses to believe of a request
// (docs/security.md, "What each part checks"): each case is an attack, and
// the engine's log shows it failed.
func TestTrust(t *testing.T) {
	e := newEnv(t)
	e.eng.handle(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"x","object":"chat.completion","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}`))
	})
	cfg := e.config()
	cfg.Endpoints = subjects.AllEndpoints()
	e.start(cfg)
	e.waitReady("r-1")

	status := func(t *testing.T, id, endpoint, maxTokens, body string) int {
		t.Helper()
		h := chatHeaders(id)
		h.Del(subjects.HdrStream)
		h.Set(subjects.HdrEndpoint, endpoint)
		if maxTokens != "" {
			h.Set(subjects.HdrMaxTokens, maxTokens)
		}
		msgs := untilEnd(t, e.request("r-1", h, body))
		last := msgs[len(msgs)-1]
		for _, m := range msgs {
			if s := m.Header.Get(subjects.HdrStatus); s != "" {
				n, _ := strconv.Atoi(s)
				return n
			}
		}
		t.Fatalf("no status in %v", last.Header)
		return 0
	}
	seenPath := func(path string) bool {
		for _, s := range e.eng.requests() {
			if s.Path == path {
				return true
			}
		}
		return false
	}

	t.Run("an endpoint Switchyard does not serve never reaches the engine", func(t *testing.T) {
		for _, p := range []string{"/v1/unload_lora_adapter", "/v1/load_lora_adapter", "/v1/chat/completions/../../v1/unload_lora_adapter", "/v1/tokenize", "/metrics"} {
			if got := status(t, "bad-ep-"+p, p, "", `{"lora_name":"team-x"}`); got != http.StatusBadRequest {
				t.Errorf("%s: status %d, want 400", p, got)
			}
			if seenPath(p) {
				t.Errorf("%s reached the engine", p)
			}
		}
	})

	t.Run("the engine receives the reserved max_tokens", func(t *testing.T) {
		for _, tc := range []struct{ name, body string }{
			{"over", `{"model":"m","max_tokens":100000,"messages":[]}`},
			{"absent", `{"model":"m","messages":[]}`},
			{"max_completion_tokens", `{"model":"m","max_completion_tokens":100000,"messages":[]}`},
		} {
			before := len(e.eng.requests())
			if got := status(t, "max-"+tc.name, subjects.EndpointChat, "64", tc.body); got != http.StatusOK {
				t.Fatalf("%s: status %d", tc.name, got)
			}
			reqs := e.eng.requests()[before:]
			if len(reqs) != 1 {
				t.Fatalf("%s: engine saw %d requests", tc.name, len(reqs))
			}
			for _, k := range []string{"max_tokens", "max_completion_tokens"} {
				if v, ok := reqs[0].Body[k]; ok && v != float64(64) {
					t.Errorf("%s: engine got %s %v, want 64", tc.name, k, v)
				}
			}
			if reqs[0].Body["max_tokens"] == nil && reqs[0].Body["max_completion_tokens"] == nil {
				t.Errorf("%s: engine got no max_tokens: %v", tc.name, reqs[0].Body)
			}
		}
	})

	t.Run("the Responses and Messages engines receive the reserved limit", func(t *testing.T) {
		for _, tc := range []struct{ name, endpoint, field, body string }{
			{"responses over", subjects.EndpointResponses, "max_output_tokens", `{"model":"m","max_output_tokens":100000,"input":"hi"}`},
			{"responses absent", subjects.EndpointResponses, "max_output_tokens", `{"model":"m","input":"hi"}`},
			{"messages over", subjects.EndpointMessages, "max_tokens", `{"model":"m","max_tokens":100000,"messages":[]}`},
			{"messages absent", subjects.EndpointMessages, "max_tokens", `{"model":"m","messages":[]}`},
		} {
			before := len(e.eng.requests())
			if got := status(t, "limit-"+tc.name, tc.endpoint, "64", tc.body); got != http.StatusOK {
				t.Fatalf("%s: status %d", tc.name, got)
			}
			reqs := e.eng.requests()[before:]
			if len(reqs) != 1 || reqs[0].Path != tc.endpoint {
				t.Fatalf("%s: engine saw %v", tc.name, reqs)
			}
			if v := reqs[0].Body[tc.field]; v != float64(64) {
				t.Errorf("%s: engine got %s %v, want 64: %v", tc.name, tc.field, v, reqs[0].Body)
			}
		}
	})

	t.Run("more than one answer is refused", func(t *testing.T) {
		before := len(e.eng.requests())
		for _, b := range []string{`{"model":"m","n":8,"messages":[]}`, `{"model":"m","prompt":"x","best_of":4}`} {
			if got := status(t, "n-"+b, subjects.EndpointChat, "64", b); got != http.StatusBadRequest {
				t.Errorf("%s: status %d, want 400", b, got)
			}
		}
		if n := len(e.eng.requests()) - before; n != 0 {
			t.Errorf("engine saw %d requests asking for several answers", n)
		}
	})

	t.Run("an absurd Llm-Max-Tokens is refused", func(t *testing.T) {
		for _, v := range []string{"0", "-5", "1e9", "99999999999"} {
			if got := status(t, "absurd-"+v, subjects.EndpointChat, v, `{"model":"m","messages":[]}`); got != http.StatusBadRequest {
				t.Errorf("Llm-Max-Tokens %s: status %d, want 400", v, got)
			}
		}
	})
}
