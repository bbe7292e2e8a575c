package gateway_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
)

// startGateway runs a gateway on a real nats-server with the dev table, and
// counts every message that reaches a route subject (no broker runs; the
// gateway leaves deciding to the brokers).
func startGateway(t *testing.T, cfg gateway.Config) (url string, routed *atomic.Int64) {
	t.Helper()
	_, natsURL := natstest.Start(t)
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	seedDevTable(t, nc)
	routed = new(atomic.Int64)
	if _, err := nc.Subscribe("llm.gw.*", func(m *nats.Msg) { routed.Add(1) }); err != nil {
		t.Fatal(err)
	}
	cfg.AcceptTimeout = 100 * time.Millisecond
	cfg.Decide = gateway.DecideBroker // what reaches the brokers is counted
	g, err := gateway.New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln := testkit.Listen(t)
	rctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = g.Serve(rctx, ln) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, testkit.Cond("the gateway to load the table", func() bool { return g.Table() != nil }))
	return "http://" + ln.Addr().String(), routed
}

type openAIError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	} `json:"error"`
}

func TestBadInputIsRejectedAtTheGateway(t *testing.T) {
	url, routed := startGateway(t, gateway.Config{MaxBody: 512 << 10})
	chat := "/v1/chat/completions"
	big := `{"model":"chat-small","messages":[{"role":"user","content":"` + strings.Repeat("a", 1<<20) + `"}]}`
	for _, tc := range []struct {
		name, method, path, body string
		headers                  map[string]string
		status                   int
		code, param              string
	}{
		{"malformed JSON", "POST", chat, `{"model":"chat-small",`, nil, 400, "invalid_request_error", ""},
		{"not an object", "POST", chat, `[1,2]`, nil, 400, "invalid_request_error", ""},
		{"model of the wrong type", "POST", chat, `{"model":7,"messages":[{"role":"user","content":"x"}]}`, nil, 400, "invalid_request_error", "model"},
		{"missing model", "POST", chat, `{"messages":[{"role":"user","content":"x"}]}`, nil, 400, "invalid_request_error", "model"},
		{"empty messages", "POST", chat, `{"model":"chat-small","messages":[]}`, nil, 400, "invalid_request_error", "messages"},
		{"messages of the wrong type", "POST", chat, `{"model":"chat-small","messages":"hi"}`, nil, 400, "invalid_request_error", "messages"},
		{"negative max_tokens", "POST", chat, `{"model":"chat-small","max_tokens":-1,"messages":[{"role":"user","content":"x"}]}`, nil, 400, "invalid_request_error", "max_tokens"},
		{"absurd max_tokens", "POST", chat, `{"model":"chat-small","max_tokens":1e12,"messages":[{"role":"user","content":"x"}]}`, nil, 400, "invalid_request_error", "max_tokens"},
		{"stream of the wrong type", "POST", chat, `{"model":"chat-small","stream":"yes","messages":[{"role":"user","content":"x"}]}`, nil, 400, "invalid_request_error", "stream"},
		{"invalid UTF-8", "POST", chat, "{\"model\":\"chat-small\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}", nil, 400, "invalid_request_error", ""},
		{"missing prompt", "POST", "/v1/completions", `{"model":"chat-small"}`, nil, 400, "invalid_request_error", "prompt"},
		{"missing input", "POST", "/v1/embeddings", `{"model":"chat-small"}`, nil, 400, "invalid_request_error", "input"},
		{"body over the limit", "POST", chat, big, nil, 413, "request_too_large", ""},
		{"bad X-Priority", "POST", chat, `{"model":"chat-small","messages":[{"role":"user","content":"x"}]}`, map[string]string{"X-Priority": "urgent"}, 400, "invalid_request_error", "X-Priority"},
		{"bad X-Request-Timeout", "POST", chat, `{"model":"chat-small","messages":[{"role":"user","content":"x"}]}`, map[string]string{"X-Request-Timeout": "soon"}, 400, "invalid_request_error", "X-Request-Timeout"},
		{"negative X-Request-Timeout", "POST", chat, `{"model":"chat-small","messages":[{"role":"user","content":"x"}]}`, map[string]string{"X-Request-Timeout": "-3"}, 400, "invalid_request_error", "X-Request-Timeout"},
		{"TTFT objective not a duration", "POST", chat, `{"model":"chat-small","messages":[{"role":"user","content":"x"}]}`, map[string]string{"X-Switchyard-TTFT-Objective": "800"}, 400, "invalid_request_error", "X-Switchyard-TTFT-Objective"},
		{"TTFT objective too short", "POST", chat, `{"model":"chat-small","messages":[{"role":"user","content":"x"}]}`, map[string]string{"X-Switchyard-TTFT-Objective": "999us"}, 400, "invalid_request_error", "X-Switchyard-TTFT-Objective"},
		{"TTFT objective too long", "POST", chat, `{"model":"chat-small","messages":[{"role":"user","content":"x"}]}`, map[string]string{"X-Switchyard-TTFT-Objective": "10m1s"}, 400, "invalid_request_error", "X-Switchyard-TTFT-Objective"},
		{"negative TTFT objective", "POST", chat, `{"model":"chat-small","messages":[{"role":"user","content":"x"}]}`, map[string]string{"X-Switchyard-TTFT-Objective": "-1s"}, 400, "invalid_request_error", "X-Switchyard-TTFT-Objective"},
		{"bad conversation id", "POST", chat, `{"model":"chat-small","messages":[{"role":"user","content":"x"}]}`, map[string]string{"X-Conversation-Id": "has space"}, 400, "invalid_request_error", "X-Conversation-Id"},
		{"conversation id too long", "POST", chat, `{"model":"chat-small","messages":[{"role":"user","content":"x"}]}`, map[string]string{"X-Conversation-Id": strings.Repeat("c", 200)}, 400, "invalid_request_error", "X-Conversation-Id"},
		{"unknown endpoint", "POST", "/v1/audio/speech", `{}`, nil, 404, "not_found", ""},
		{"unknown path", "GET", "/admin", "", nil, 404, "not_found", ""},
		{"wrong method", "GET", chat, "", nil, 405, "method_not_allowed", ""},
		{"wrong method on models", "POST", "/v1/models", `{}`, nil, 405, "method_not_allowed", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := routed.Load()
			req, _ := http.NewRequest(tc.method, url+tc.path, strings.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json")
			for k, v := range tc.headers {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			var e openAIError
			if err := json.Unmarshal(b, &e); err != nil {
				t.Fatalf("not the OpenAI error shape: %v: %s", err, b)
			}
			if resp.StatusCode != tc.status || e.Error.Code != tc.code || e.Error.Message == "" || e.Error.Type == "" {
				t.Errorf("got %d %+v; want %d %s", resp.StatusCode, e.Error, tc.status, tc.code)
			}
			if tc.param != "" && (e.Error.Param == nil || *e.Error.Param != tc.param) {
				t.Errorf("param = %v, want %q (message %q)", e.Error.Param, tc.param, e.Error.Message)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
			if n := routed.Load() - before; n != 0 {
				t.Errorf("%d message(s) reached a broker subject; the gateway should have answered alone", n)
			}
		})
	}
}

func TestNoBrokerIsAnExplicit503(t *testing.T) {
	url, routed := startGateway(t, gateway.Config{})
	// A subscriber counts messages but never answers: the gateway hears no
	// accept within its accept timeout, retries, then fails explicitly.
	resp, err := http.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"chat-small","messages":[{"role":"user","content":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e openAIError
	_ = json.NewDecoder(resp.Body).Decode(&e)
	if resp.StatusCode != http.StatusGatewayTimeout || e.Error.Code != "upstream_timeout" {
		t.Errorf("got %d %+v, want 504 upstream_timeout", resp.StatusCode, e.Error)
	}
	if n := routed.Load(); n != 3 {
		t.Errorf("route subject saw %d attempts, want 3 (one try and two retries)", n)
	}
}
