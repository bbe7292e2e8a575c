package enginesim_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/switchyard-llm/switchyard/enginesim"
	"github.com/switchyard-llm/switchyard/internal/sse"
	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// TestMain fails the package when a goroutine outlives the tests.
func TestMain(m *testing.M) { testkit.Main(m, testkit.IgnoreZMQPub()) }

// start runs a server with its owner goroutine and an httptest front, both
// stopped when the test ends.
func start(t *testing.T, cfg enginesim.ServerConfig) (*enginesim.Server, *httptest.Server) {
	t.Helper()
	srv := enginesim.NewServer(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		hs.Close()
	})
	return srv, hs
}

func post(t *testing.T, hs *httptest.Server, path, body string, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, hs.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := hs.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func readJSON(t *testing.T, r io.Reader) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.NewDecoder(r).Decode(&m); err != nil {
		t.Fatalf("decode: %v", err)
	}
	return m
}

func golden(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// keys lists the key paths of a JSON value ("usage.prompt_tokens",
// "choices[].message.role"), to compare shapes without values.
func keys(v any, prefix string, out map[string]bool) map[string]bool {
	if out == nil {
		out = map[string]bool{}
	}
	switch x := v.(type) {
	case map[string]any:
		for k, child := range x {
			out[prefix+k] = true
			keys(child, prefix+k+".", out)
		}
	case []any:
		for _, child := range x {
			keys(child, strings.TrimSuffix(prefix, ".")+"[].", out)
		}
	}
	return out
}

func sameKeys(t *testing.T, what string, got, want any) {
	t.Helper()
	g, w := keys(got, "", nil), keys(want, "", nil)
	for k := range w {
		if !g[k] {
			t.Errorf("%s: missing key %q", what, k)
		}
	}
	for k := range g {
		if !w[k] {
			t.Errorf("%s: extra key %q", what, k)
		}
	}
}

// streamData reads a stream's data payloads, in order.
func streamData(t *testing.T, r io.Reader) []string { return fieldValues(t, r, "data") }

// fieldValues reads the values of a stream's lines of one field, in order.
func fieldValues(t *testing.T, r io.Reader, field string) []string {
	t.Helper()
	var out []string
	sr := sse.NewReader(r, 1<<20)
	for {
		l, err := sr.Next()
		if err != nil {
			return out
		}
		if l.Field == field {
			out = append(out, string(l.Value))
		}
	}
}

const chatBody = `{"model":"sim-model","messages":[{"role":"user","content":"What is the weather like?"}]%s}`

func TestChatCompletionMatchesVLLMShape(t *testing.T) {
	_, hs := start(t, enginesim.ServerConfig{Engine: enginesim.Config{Model: "sim-model"}, Speed: 10})
	resp := post(t, hs, "/v1/chat/completions", fmtBody(chatBody, `,"max_tokens":5`), "X-Request-Id", "req-42")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if got := resp.Header.Get("X-Request-Id"); got != "req-42" {
		t.Errorf("X-Request-Id = %q, want echoed req-42", got)
	}
	got := readJSON(t, resp.Body)
	var want map[string]any
	if err := json.Unmarshal(golden(t, "chat-completion.json"), &want); err != nil {
		t.Fatal(err)
	}
	sameKeys(t, "chat completion", got, want)
	if got["id"] != "chatcmpl-req-42" || got["object"] != "chat.completion" || got["model"] != "sim-model" {
		t.Errorf("id/object/model = %v %v %v", got["id"], got["object"], got["model"])
	}
	choice := got["choices"].([]any)[0].(map[string]any)
	content := choice["message"].(map[string]any)["content"].(string)
	if n := len(strings.Fields(content)); n != 5 {
		t.Errorf("content %q has %d words, want 5", content, n)
	}
	if choice["finish_reason"] != "length" {
		t.Errorf("finish_reason = %v, want length (max_tokens reached)", choice["finish_reason"])
	}
	u := got["usage"].(map[string]any)
	if u["completion_tokens"] != 5.0 || u["total_tokens"] != u["prompt_tokens"].(float64)+5 {
		t.Errorf("usage = %v", u)
	}

	// Without max_tokens: the default length and a natural stop; the answer
	// to the same prompt starts the same way.
	again := readJSON(t, post(t, hs, "/v1/chat/completions", fmtBody(chatBody, "")).Body)
	c2 := again["choices"].([]any)[0].(map[string]any)
	text2 := c2["message"].(map[string]any)["content"].(string)
	if c2["finish_reason"] != "stop" || len(strings.Fields(text2)) != 16 || !strings.HasPrefix(text2, content) {
		t.Errorf("default answer %q (%v), want 16 words starting with %q and stop", text2, c2["finish_reason"], content)
	}
}

func fmtBody(tmpl, extra string) string { return strings.Replace(tmpl, "%s", extra, 1) }

func TestChatStreamMatchesVLLMShape(t *testing.T) {
	_, hs := start(t, enginesim.ServerConfig{Engine: enginesim.Config{Model: "sim-model"}, Adapters: []string{"lora-a"}, Speed: 10})
	body := `{"model":"lora-a","stream":true,"stream_options":{"include_usage":true},"max_tokens":4,` +
		`"messages":[{"role":"user","content":"Hamlet, act three"}]}`
	resp := post(t, hs, "/v1/chat/completions", body)
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("status %d content-type %q", resp.StatusCode, ct)
	}
	got := streamData(t, resp.Body)
	want := streamData(t, bytes.NewReader(golden(t, "chat-stream-lora.sse")))
	if len(got) != len(want) {
		t.Fatalf("%d events, want %d like vLLM (role, 4 tokens, finish, usage, [DONE]):\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	if got[len(got)-1] != "[DONE]" {
		t.Errorf("last event %q, want [DONE]", got[len(got)-1])
	}
	var text strings.Builder
	for i := range len(got) - 1 {
		var g, w map[string]any
		if err := json.Unmarshal([]byte(got[i]), &g); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		_ = json.Unmarshal([]byte(want[i]), &w)
		sameKeys(t, "chunk "+strconv.Itoa(i), g, w)
		if g["model"] != "lora-a" {
			t.Errorf("chunk model %v, want lora-a", g["model"])
		}
		if ch, _ := g["choices"].([]any); len(ch) > 0 {
			if d, ok := ch[0].(map[string]any)["delta"].(map[string]any); ok {
				s, _ := d["content"].(string)
				text.WriteString(s)
			}
		}
	}
	var last map[string]any
	_ = json.Unmarshal([]byte(got[len(got)-2]), &last)
	if u, _ := last["usage"].(map[string]any); u == nil || u["completion_tokens"] != 4.0 {
		t.Errorf("usage chunk %v, want completion_tokens 4", last)
	}
	if n := len(strings.Fields(text.String())); n != 4 {
		t.Errorf("streamed text %q has %d words, want 4", text.String(), n)
	}
}

func TestStreamWithoutUsageOption(t *testing.T) {
	_, hs := start(t, enginesim.ServerConfig{Speed: 10})
	got := streamData(t, post(t, hs, "/v1/chat/completions", fmtBody(chatBody, `,"stream":true,"max_tokens":2`)).Body)
	if len(got) != 5 || got[4] != "[DONE]" {
		t.Fatalf("events %q, want role, 2 tokens, finish, [DONE]", got)
	}
	for _, ev := range got[:4] {
		if strings.Contains(ev, `"usage"`) {
			t.Errorf("chunk %s carries usage without include_usage", ev)
		}
	}
}

func TestCompletions(t *testing.T) {
	_, hs := start(t, enginesim.ServerConfig{Engine: enginesim.Config{Model: "m"}, Speed: 10})
	got := readJSON(t, post(t, hs, "/v1/completions", `{"model":"m","prompt":"Once upon a time","max_tokens":3}`).Body)
	choice := got["choices"].([]any)[0].(map[string]any)
	if got["object"] != "text_completion" || len(strings.Fields(choice["text"].(string))) != 3 || choice["finish_reason"] != "length" {
		t.Errorf("completion = %v", got)
	}
	ids := readJSON(t, post(t, hs, "/v1/completions", `{"model":"m","prompt":[1,2,3,4,5,6,7,8],"max_tokens":1}`).Body)
	if u := ids["usage"].(map[string]any); u["prompt_tokens"] != 8.0 {
		t.Errorf("token-id prompt usage = %v, want 8 prompt tokens", u)
	}
	events := streamData(t, post(t, hs, "/v1/completions", `{"model":"m","prompt":"Once upon a time","max_tokens":3,"stream":true}`).Body)
	if len(events) != 5 || events[4] != "[DONE]" || !strings.Contains(events[0], `"text_completion"`) {
		t.Errorf("stream = %q, want 3 tokens, finish, [DONE]", events)
	}
}

func TestPrefixCacheOverHTTP(t *testing.T) {
	_, hs := start(t, enginesim.ServerConfig{Speed: 10})
	long := strings.Repeat("a shared system prompt that many requests start with. ", 40)
	body := `{"model":"sim-model","max_tokens":1,"messages":[{"role":"system","content":"` + long + `"}]}`
	cached := func() float64 {
		u := readJSON(t, post(t, hs, "/v1/chat/completions", body).Body)["usage"].(map[string]any)
		return u["prompt_tokens_details"].(map[string]any)["cached_tokens"].(float64)
	}
	if c := cached(); c != 0 {
		t.Errorf("first request cached %v tokens, want 0", c)
	}
	if c := cached(); c < 500 {
		t.Errorf("repeated prompt cached %v tokens, want most of its ~560", c)
	}
}

func TestModelsListsAdaptersWithParent(t *testing.T) {
	_, hs := start(t, enginesim.ServerConfig{Engine: enginesim.Config{Model: "sim-model"}, Adapters: []string{"lora-b", "lora-a"}})
	resp, err := hs.Client().Get(hs.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got := readJSON(t, resp.Body)
	var want map[string]any
	_ = json.Unmarshal(golden(t, "models.json"), &want)
	sameKeys(t, "models", got, want)
	parents := map[string]any{}
	for _, d := range got["data"].([]any) {
		m := d.(map[string]any)
		parents[m["id"].(string)] = m["parent"]
	}
	wantParents := map[string]any{"sim-model": nil, "lora-a": "sim-model", "lora-b": "sim-model"}
	if len(parents) != 3 || parents["sim-model"] != nil || parents["lora-a"] != "sim-model" || parents["lora-b"] != "sim-model" {
		t.Errorf("parents = %v, want %v", parents, wantParents)
	}
}

func TestRuntimeLoraLoading(t *testing.T) {
	_, hs := start(t, enginesim.ServerConfig{Engine: enginesim.Config{MaxLoras: 2}, Speed: 10})
	chat := func() int {
		return post(t, hs, "/v1/chat/completions", `{"model":"team-x-v3","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`).StatusCode
	}
	if s := chat(); s != 404 {
		t.Errorf("before loading: status %d, want 404", s)
	}
	if s := post(t, hs, "/v1/load_lora_adapter", `{"lora_name":"team-x-v3","lora_path":"/x"}`).StatusCode; s != 200 {
		t.Fatalf("load: status %d", s)
	}
	if s := post(t, hs, "/v1/load_lora_adapter", `{"lora_name":"team-x-v3","lora_path":"/x"}`).StatusCode; s != 400 {
		t.Errorf("second load: status %d, want 400", s)
	}
	if s := chat(); s != 200 {
		t.Errorf("after loading: status %d, want 200", s)
	}
	if s := post(t, hs, "/v1/unload_lora_adapter", `{"lora_name":"team-x-v3"}`).StatusCode; s != 200 {
		t.Errorf("unload: status %d", s)
	}
	if s := chat(); s != 404 {
		t.Errorf("after unloading: status %d, want 404", s)
	}
}

func TestErrors(t *testing.T) {
	_, hs := start(t, enginesim.ServerConfig{Engine: enginesim.Config{Model: "sim-model", KVBlocks: 8}})
	resp := post(t, hs, "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`)
	var got, want any
	_ = json.NewDecoder(resp.Body).Decode(&got)
	_ = json.Unmarshal(golden(t, "error-unknown-model.json"), &want)
	b1, _ := json.Marshal(got)
	b2, _ := json.Marshal(want)
	if resp.StatusCode != 404 || !bytes.Equal(b1, b2) {
		t.Errorf("unknown model: %d %s, want 404 %s", resp.StatusCode, b1, b2)
	}
	cases := []struct {
		path, body string
		status     int
	}{
		{"/v1/chat/completions", `{"model":`, 400},
		{"/v1/chat/completions", `{"model":"sim-model","messages":[]}`, 400},
		{"/v1/chat/completions", `{"model":"sim-model","max_tokens":0,"messages":[{"role":"user","content":"x"}]}`, 400},
		{"/v1/chat/completions", `{"model":"sim-model","max_tokens":200,"messages":[{"role":"user","content":"x"}]}`, 400},
		{"/v1/completions", `{"model":"sim-model","prompt":{"a":1}}`, 400},
		{"/v1/embeddings", `{"model":"nope","input":"x"}`, 404},
		{"/v1/nothing", `{}`, 404},
	}
	for _, c := range cases {
		resp := post(t, hs, c.path, c.body)
		if resp.StatusCode != c.status {
			t.Errorf("POST %s %s: status %d, want %d", c.path, c.body, resp.StatusCode, c.status)
		}
		if c.status == 400 {
			e := readJSON(t, resp.Body)["error"].(map[string]any)
			if e["code"] != 400.0 || e["type"] != "BadRequestError" {
				t.Errorf("POST %s %s: error %v, want vLLM's shape", c.path, c.body, e)
			}
		}
	}
	h, err := hs.Client().Get(hs.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	h.Body.Close()
	if h.StatusCode != 200 {
		t.Errorf("/health: %d", h.StatusCode)
	}
}

func TestEmbeddingsAreDeterministic(t *testing.T) {
	_, hs := start(t, enginesim.ServerConfig{})
	vec := func(input string) [][]float64 {
		got := readJSON(t, post(t, hs, "/v1/embeddings", `{"model":"sim-model","input":`+input+`}`).Body)
		var out [][]float64
		for _, d := range got["data"].([]any) {
			var v []float64
			for _, x := range d.(map[string]any)["embedding"].([]any) {
				v = append(v, x.(float64))
			}
			out = append(out, v)
		}
		return out
	}
	a, b := vec(`"hello"`), vec(`["hello","world"]`)
	if len(a) != 1 || len(b) != 2 || len(a[0]) != 64 {
		t.Fatalf("shapes %d, %d, dim %d", len(a), len(b), len(a[0]))
	}
	if !slices.Equal(a[0], b[0]) || slices.Equal(b[0], b[1]) {
		t.Error("same input must give the same vector and different inputs different ones")
	}
	var norm float64
	for _, x := range a[0] {
		norm += x * x
	}
	if norm < 0.999 || norm > 1.001 {
		t.Errorf("squared norm %v, want 1", norm)
	}
}
