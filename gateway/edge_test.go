package gateway_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/switchyard-llm/switchyard/gateway"
)

func do(t *testing.T, method, url string, hdr map[string]string, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestModelRetrieveAgreesWithTheList(t *testing.T) {
	u := newUpstream(t, gateway.Config{}, nil)
	resp, body := do(t, "GET", u.gw+"/v1/models/chat-large", nil, "")
	var m struct{ ID, Object string }
	if resp.StatusCode != 200 || json.Unmarshal([]byte(body), &m) != nil || m.ID != "chat-large" || m.Object != "model" {
		t.Fatalf("GET /v1/models/chat-large = %d %s, want the model object", resp.StatusCode, body)
	}
	resp, body = do(t, "GET", u.gw+"/v1/models/no-such-model", nil, "")
	if resp.StatusCode != 404 || !strings.Contains(body, `"code":"model_not_found"`) {
		t.Errorf("unknown model = %d %s, want 404 model_not_found", resp.StatusCode, body)
	}
}

func TestEveryAnswerCarriesARequestID(t *testing.T) {
	u := newUpstream(t, gateway.Config{}, func(r *reply, _ int) { r.stream("r-0", 2) })
	for _, c := range []struct {
		name, method, path, body, sent string
	}{
		{"relayed stream", "POST", "/v1/chat/completions", `{"model":"chat-large","stream":true,"messages":[{"role":"user","content":"hi"}]}`, ""},
		{"relayed, client's id", "POST", "/v1/chat/completions", `{"model":"chat-large","stream":true,"messages":[{"role":"user","content":"hi"}]}`, "client-7"},
		{"bad request", "POST", "/v1/chat/completions", `{`, ""},
		{"unknown path", "GET", "/v2/nothing", "", ""},
		{"models", "GET", "/v1/models", "", "client-8"},
	} {
		t.Run(c.name, func(t *testing.T) {
			hdr := map[string]string{}
			if c.sent != "" {
				hdr["X-Request-Id"] = c.sent
			}
			resp, _ := do(t, c.method, u.gw+c.path, hdr, c.body)
			got := resp.Header.Get("X-Request-Id")
			if got == "" || c.sent != "" && got != c.sent {
				t.Errorf("x-request-id = %q, want %q (or a fresh one when none was sent)", got, c.sent)
			}
		})
	}
}

func TestCORSIsOffUnlessAnOriginIsAllowed(t *testing.T) {
	preflight := map[string]string{
		"Origin":                         "https://app.example",
		"Access-Control-Request-Method":  "POST",
		"Access-Control-Request-Headers": "authorization, content-type, x-stainless-os, x-api-key, anthropic-version",
	}
	off := newUpstream(t, gateway.Config{}, nil)
	resp, _ := do(t, "OPTIONS", off.gw+"/v1/chat/completions", preflight, "")
	if resp.StatusCode == 204 || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("CORS off: preflight = %d with Allow-Origin %q, want no CORS answer", resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin"))
	}

	on := newUpstream(t, gateway.Config{CORSOrigins: []string{"https://app.example"}}, nil)
	resp, _ = do(t, "OPTIONS", on.gw+"/v1/chat/completions", preflight, "")
	if resp.StatusCode != 204 {
		t.Fatalf("preflight = %d, want 204", resp.StatusCode)
	}
	if got := resp.Header.Get("Access-Control-Allow-Origin"); got != "https://app.example" {
		t.Errorf("Allow-Origin = %q", got)
	}
	if got := resp.Header.Get("Access-Control-Allow-Headers"); got != preflight["Access-Control-Request-Headers"] {
		t.Errorf("Allow-Headers = %q, want the requested headers reflected", got)
	}
	other := map[string]string{"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
	resp, _ = do(t, "OPTIONS", on.gw+"/v1/chat/completions", other, "")
	if resp.StatusCode == 204 || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("origin not allowed: preflight = %d, Allow-Origin %q", resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin"))
	}
	resp, _ = do(t, "GET", on.gw+"/v1/models", map[string]string{"Origin": "https://app.example"}, "")
	exposed := strings.ToLower(resp.Header.Get("Access-Control-Expose-Headers"))
	for _, h := range []string{"x-switchyard-replica", "x-request-id", "x-ratelimit-remaining-requests", "retry-after"} {
		if !strings.Contains(exposed, h) {
			t.Errorf("Expose-Headers %q lacks %s", exposed, h)
		}
	}
	if _, err := gateway.New(on.nc, gateway.Config{CORSOrigins: []string{"app.example"}}); err == nil || !strings.Contains(err.Error(), "cors-origin") {
		t.Errorf("an origin without a scheme: err %v, want one naming --cors-origin", err)
	}
}

// A stream that fails after its first byte ends with the error event of its
// API: one data line on chat (no event line, no [DONE]), the Responses API's
// error event, Anthropic's error event; and errors before the first byte
// take the endpoint's shape too.
func TestStreamErrorsTakeTheEndpointsShape(t *testing.T) {
	u := newUpstream(t, gateway.Config{}, func(r *reply, _ int) {
		r.accept("r-0")
		r.head(200, "text/event-stream")
		r.send(nil, "event: x\ndata: {\"i\":0}\n\n")
		r.end("engine stream broke")
	})
	for _, c := range []struct{ path, body, tail string }{
		{"/v1/chat/completions", `{"model":"chat-large","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
			"\n\ndata: {\"error\":{\"message\":\"engine failed mid-response: engine stream broke\",\"type\":\"server_error\",\"param\":null,\"code\":\"upstream_error\"}}\n\n"},
		{"/v1/responses", `{"model":"chat-large","stream":true,"input":"hi"}`,
			"\n\nevent: error\ndata: {\"type\":\"error\",\"code\":\"upstream_error\",\"message\":\"engine failed mid-response: engine stream broke\",\"param\":null}\n\n"},
		{"/v1/messages", `{"model":"chat-large","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`,
			"\n\nevent: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"engine failed mid-response: engine stream broke\"}}\n\n"},
	} {
		resp, body := do(t, "POST", u.gw+c.path, nil, c.body)
		if resp.StatusCode != 200 || !strings.HasSuffix(body, c.tail) {
			t.Errorf("%s: %d %q\nwant it to end with %q", c.path, resp.StatusCode, body, c.tail)
		}
	}
	resp, body := do(t, "POST", u.gw+"/v1/messages", nil, `{"model":"chat-large","messages":"no"}`)
	if resp.StatusCode != 400 || !strings.HasPrefix(body, `{"type":"error","error":{"type":"invalid_request_error","message":`) {
		t.Errorf("bad messages request: %d %s, want 400 in Anthropic's shape", resp.StatusCode, body)
	}
}
