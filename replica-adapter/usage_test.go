package adapter

import (
	"bytes"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/internal/sse"
	"github.com/switchyard-llm/switchyard/subjects"
)

// feed writes b into the scanner in random cuts, as reads return it.
func feed(u *usageScanner, b []byte, rng *rand.Rand) {
	for len(b) > 0 {
		n := min(len(b), 1+rng.IntN(64))
		u.Write(b[:n])
		b = b[n:]
	}
}

func TestUsageSSE(t *testing.T) {
	sse, err := os.ReadFile("testdata/vllm/chat-stream-lora.sse")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		u := usageScanner{sse: true}
		feed(&u, sse, rand.New(rand.NewPCG(uint64(i), 7)))
		got, ok := u.Finish()
		if !ok || got != (tokens{PromptTokens: 6, CompletionTokens: 4}) {
			t.Fatalf("cut %d: usage %+v %v, want 6/4", i, got, ok)
		}
	}
}

func TestUsageSSEWithoutUsage(t *testing.T) {
	u := usageScanner{sse: true}
	u.Write([]byte("data: {\"usage\":null,\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\r\n\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"\\\"usage\\\":{\\\"prompt_tokens\\\":99}\"}}]}\n\n: comment\n\ndata: [DONE]\n\n"))
	if got, ok := u.Finish(); ok {
		t.Errorf("found usage %+v in a stream without one", got)
	}
	if u.events != 2 {
		t.Errorf("events %d, want 2", u.events)
	}
}

// An event is read as the gateway reads it: a data field over several
// lines is one event and one JSON value, whatever the line ends.
func TestUsageSSEReadsWholeEvents(t *testing.T) {
	for name, body := range map[string]string{
		"LF":   "data: {\"choices\":[]}\n\ndata: {\"usage\":\ndata: {\"prompt_tokens\":3,\"completion_tokens\":4}}\n\ndata: [DONE]\n\n",
		"CR":   "data: {\"choices\":[]}\r\rdata: {\"usage\":\rdata: {\"prompt_tokens\":3,\"completion_tokens\":4}}\r\rdata: [DONE]\r\r",
		"CRLF": "data: {\"choices\":[]}\r\n\r\ndata: {\"usage\":\r\ndata: {\"prompt_tokens\":3,\"completion_tokens\":4}}\r\n\r\ndata: [DONE]",
	} {
		for i := range 20 {
			u := usageScanner{sse: true}
			feed(&u, []byte(body), rand.New(rand.NewPCG(uint64(i), 5)))
			if got, ok := u.Finish(); !ok || got != (tokens{3, 4, 0}) || u.events != 2 {
				t.Fatalf("%s, cut %d: usage %+v %v over %d events, want 3/4 over 2", name, i, got, ok, u.events)
			}
		}
	}
}

// An event too long to hold is skipped, not buffered, and the events
// after it still count.
func TestUsageSSELongEventSkipped(t *testing.T) {
	u := usageScanner{sse: true}
	u.Write([]byte("data: {\"x\":\""))
	for range 3 {
		u.Write(bytes.Repeat([]byte("a"), sse.MaxEvent/2))
		if held := len(u.split.Pending()); held > sse.MaxEvent {
			t.Fatalf("holding %d bytes of an oversized event", held)
		}
	}
	u.Write([]byte("\"}\n\ndata: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n"))
	if got, ok := u.Finish(); !ok || got != (tokens{1, 2, 0}) {
		t.Errorf("usage %+v %v after a long event", got, ok)
	}
	if u.events != 1 {
		t.Errorf("counted %d events, want the one after the long event", u.events)
	}
}

func TestUsageJSON(t *testing.T) {
	body, err := os.ReadFile("testdata/vllm/chat-completion.json")
	if err != nil {
		t.Fatal(err)
	}
	u := usageScanner{}
	feed(&u, body, rand.New(rand.NewPCG(1, 2)))
	if got, ok := u.Finish(); !ok || got != (tokens{6, 3, 0}) {
		t.Errorf("usage %+v %v, want 6/3", got, ok)
	}

	// An embeddings-sized body with usage at its end, past both windows.
	var big bytes.Buffer
	big.WriteString(`{"object":"list","data":[{"embedding":[`)
	for big.Len() < 4*usageWindow {
		big.WriteString("0.0123456,")
	}
	big.WriteString(`0]}],"usage":{"prompt_tokens":512,"total_tokens":512}}`)
	u = usageScanner{}
	feed(&u, big.Bytes(), rand.New(rand.NewPCG(3, 4)))
	if got, ok := u.Finish(); !ok || got != (tokens{PromptTokens: 512}) {
		t.Errorf("big body usage %+v %v, want 512/0", got, ok)
	}
	if len(u.head) > usageWindow || len(u.tail) > 2*usageWindow {
		t.Errorf("kept %d + %d bytes", len(u.head), len(u.tail))
	}

	// Whole, in one write, as a non-streamed answer is read.
	u = usageScanner{}
	u.Write(big.Bytes())
	if got, ok := u.Finish(); !ok || got != (tokens{PromptTokens: 512}) {
		t.Errorf("big body in one write: usage %+v %v, want 512/0", got, ok)
	}
}

// BenchmarkUsageJSON is the usage finder over a non-streamed embeddings
// answer of 512 KiB, read whole as the adapter reads one.
func BenchmarkUsageJSON(b *testing.B) {
	var big bytes.Buffer
	big.WriteString(`{"object":"list","data":[{"embedding":[`)
	for big.Len() < 8*usageWindow {
		big.WriteString("0.0123456,")
	}
	big.WriteString(`0]}],"usage":{"prompt_tokens":512,"total_tokens":512}}`)
	b.SetBytes(int64(big.Len()))
	b.ReportAllocs()
	for b.Loop() {
		u := usageScanner{}
		u.Write(big.Bytes())
		if _, ok := u.Finish(); !ok {
			b.Fatal("no usage")
		}
	}
}

func TestEngineError(t *testing.T) {
	vllm, err := os.ReadFile("testdata/vllm/error-unknown-model.json")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		status int
		body   string
		want   subjects.APIError
	}{
		{"vLLM integer code", 404, string(vllm), subjects.APIError{Status: 404, Code: subjects.CodeModelNotFound, Message: "The model `nope` does not exist."}},
		{"older vLLM flat", 400, `{"object":"error","message":"This model's maximum context length is 1024 tokens.","type":"BadRequestError","param":null,"code":400}`,
			subjects.APIError{Status: 400, Code: subjects.CodeContextLength, Message: "This model's maximum context length is 1024 tokens."}},
		{"string code kept", 400, `{"error":{"message":"bad","type":"invalid_request_error","param":"messages","code":"invalid_value"}}`,
			subjects.APIError{Status: 400, Code: "invalid_value", Message: "bad", Param: "messages"}},
		{"TGI", 422, `{"error":"Input validation error: max_new_tokens must be > 0","error_type":"validation"}`,
			subjects.APIError{Status: 422, Code: subjects.CodeInvalidRequest, Message: "Input validation error: max_new_tokens must be > 0"}},
		{"llama.cpp loading", 503, `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`,
			subjects.APIError{Status: 503, Code: subjects.CodeModelLoading, Message: "Loading model"}},
		{"plain text", 502, "Bad Gateway\n", subjects.APIError{Status: 502, Code: subjects.CodeUpstreamError, Message: "Bad Gateway"}},
		{"empty", 500, "", subjects.APIError{Status: 500, Code: subjects.CodeUpstreamError, Message: "engine answered 500 Internal Server Error"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := engineError(tt.status, []byte(tt.body))
			if got.Status != tt.want.Status || got.Code != tt.want.Code || got.Message != tt.want.Message || got.Param != tt.want.Param {
				t.Errorf("got %+v\nwant %+v", *got, tt.want)
			}
		})
	}
	long := engineError(500, []byte(strings.Repeat("é", 2000)))
	if len(long.Message) > 512 || !strings.HasPrefix(long.Message, "é") {
		t.Errorf("long text message %d bytes", len(long.Message))
	}
}

func TestTTFTAverage(t *testing.T) {
	var l loadState
	l.observeTTFT(100 * time.Millisecond)
	if l.ttftEWMA != 100 || l.ttftMin != 100 {
		t.Fatalf("first sample: ewma %v min %v", l.ttftEWMA, l.ttftMin)
	}
	l.observeTTFT(200 * time.Millisecond)
	if l.ttftEWMA != 120 || l.ttftMin != 100 {
		t.Errorf("second sample: ewma %v min %v, want 120 and 100", l.ttftEWMA, l.ttftMin)
	}
}

func TestKeepOperatorState(t *testing.T) {
	tests := []struct {
		cur, ours, want string
	}{
		{`{"state":"loading"}`, "ready", "ready"},
		{`{"state":"ready"}`, "draining", "draining"},
		{`{"state":"draining"}`, "ready", "draining"},
		{`{"state":"disabled"}`, "ready", "disabled"},
		{`{"state":"disabled"}`, "draining", "disabled"},
		{`not json`, "ready", "ready"},
	}
	for _, tt := range tests {
		if got := keepOperatorState([]byte(tt.cur), tt.ours); got != tt.want {
			t.Errorf("current %s, ours %s: wrote %s, want %s", tt.cur, tt.ours, got, tt.want)
		}
	}
}

func BenchmarkRewriteModel(b *testing.B) {
	body := []byte(`{"model":"chat-small","stream":true,"max_tokens":256,"messages":[{"role":"system","content":"` +
		strings.Repeat("You are helpful. ", 200) + `"},{"role":"user","content":"hi"}]}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := rewriteModel(body, "team-x-v3"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkUsageSSE(b *testing.B) {
	sse, err := os.ReadFile("testdata/vllm/chat-stream-lora.sse")
	if err != nil {
		b.Fatal(err)
	}
	chunks := bytes.SplitAfter(sse, []byte("\n\n"))
	b.SetBytes(int64(len(sse)))
	b.ReportAllocs()
	for b.Loop() {
		u := usageScanner{sse: true}
		for _, c := range chunks {
			u.Write(c)
		}
		if _, ok := u.Finish(); !ok {
			b.Fatal("no usage")
		}
	}
}

// The Responses and Messages APIs count input and output tokens; Anthropic's
// stream gives the input at message_start and the output at message_delta.
func TestUsageOfTheResponsesAndMessagesAPIs(t *testing.T) {
	messages := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":12,\"output_tokens\":0}}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":5}}\n\n"
	responses := "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":12,\"output_tokens\":5,\"total_tokens\":17}}}\n\n"
	for name, body := range map[string]string{"messages": messages, "responses": responses} {
		for i := range 20 {
			u := usageScanner{sse: true}
			feed(&u, []byte(body), rand.New(rand.NewPCG(uint64(i), 3)))
			if got, ok := u.Finish(); !ok || got != (tokens{PromptTokens: 12, CompletionTokens: 5}) {
				t.Fatalf("%s, cut %d: usage %+v %v, want 12/5", name, i, got, ok)
			}
		}
	}
	u := usageScanner{}
	u.Write([]byte(`{"id":"resp_1","object":"response","usage":{"input_tokens":7,"output_tokens":3,"total_tokens":10}}`))
	if got, ok := u.Finish(); !ok || got != (tokens{PromptTokens: 7, CompletionTokens: 3}) {
		t.Errorf("non-streamed response: %+v %v", got, ok)
	}
}

// The prompt tokens the engine's prefix cache served, where its usage says:
// vLLM's prompt_tokens_details (the captured stream says 0), the Responses
// API's input_tokens_details. A count above the prompt, or not a count, is
// not believed; a usage without one says nothing, nor does the Messages
// API's cache_read_input_tokens, which is not a part of its input_tokens.
func TestUsageCachedTokens(t *testing.T) {
	capture, err := os.ReadFile("testdata/vllm/chat-stream-lora.sse")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, body string
		sse        bool
		cached     int
		has        bool
	}{
		{"vllm stream", string(capture), true, 0, true},
		{"chat json", `{"usage":{"prompt_tokens":100,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":64}}}`, false, 64, true},
		{"responses", "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":100,\"output_tokens\":5,\"input_tokens_details\":{\"cached_tokens\":48}}}}\n\n", true, 48, true},
		// The Messages API's input_tokens leaves its cache reads out:
		// not a part of the prompt count, not read as one.
		{"messages", "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":100,\"cache_read_input_tokens\":32,\"output_tokens\":0}}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":5}}\n\n", true, 0, false},
		{"above the prompt", `{"usage":{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":64}}}`, false, 0, false},
		{"not a count", `{"usage":{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":"many"}}}`, false, 0, false},
		{"none", `{"usage":{"prompt_tokens":10,"completion_tokens":2}}`, false, 0, false},
	}
	for _, c := range cases {
		u := usageScanner{sse: c.sse}
		feed(&u, []byte(c.body), rand.New(rand.NewPCG(5, 9)))
		if _, ok := u.Finish(); !ok {
			t.Fatalf("%s: no usage", c.name)
		}
		if n, has := u.Cached(); n != c.cached || has != c.has {
			t.Errorf("%s: cached %d %v, want %d %v", c.name, n, has, c.cached, c.has)
		}
	}
}
