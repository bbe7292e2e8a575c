package adapter

import (
	"os"
	"testing"
)

// TestNotServing: the engine 404s that say the replica does not serve
// what it registered, and those that are the client's.
func TestNotServing(t *testing.T) {
	vllm, err := os.ReadFile("testdata/vllm/error-unknown-model.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, body, what string
	}{
		{"vLLM, unknown model", string(vllm), "model"},
		{"vLLM before v1, flat", `{"object":"error","message":"The model ` + "`x`" + ` does not exist.","type":"NotFoundError","code":404}`, "model"},
		{"OpenAI's string code", `{"error":{"message":"no such thing","code":"model_not_found"}}`, "model"},
		{"TGI's string error", `{"error":"Model x not found","error_type":"not_found"}`, "model"},
		{"FastAPI, no route for the path", `{"detail":"Not Found"}`, "endpoint"},
		{"a stored response the engine no longer has", `{"error":{"message":"Response with id 'resp_1' not found.","type":"invalid_request_error","code":404}}`, ""},
		{"not JSON", `404 page not found`, ""},
		{"empty", ``, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			what, gone := notServing([]byte(tc.body))
			if what != tc.what || gone != (tc.what != "") {
				t.Errorf("notServing(%s) = %q, %v; want %q", tc.body, what, gone, tc.what)
			}
		})
	}
}
