package gateway

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/switchyard-llm/switchyard/internal/sse"
	"github.com/switchyard-llm/switchyard/subjects"
)

// BenchmarkRelayEvents is what following a resumable stream costs the
// relay per chunk: cutting the bytes into events and reading each one.
func BenchmarkRelayEvents(b *testing.B) {
	ev := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"llama-3-8b-instruct","choices":[{"index":0,"delta":{"content":"word "},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	for _, follow := range []bool{false, true} {
		name := "split"
		if follow {
			name = "split+follow"
		}
		b.Run(name, func(b *testing.B) {
			var s sse.Events
			c := &carry{on: follow}
			b.SetBytes(int64(len(ev)))
			b.ReportAllocs()
			for b.Loop() {
				_ = s.Write(ev, func(e []byte) error { _, _ = c.event(e); return nil })
				if len(c.text) > 1<<16 {
					c.text = c.text[:0]
				}
			}
		})
	}
}

// TestPlainDeltaAgreesWithDecoding: the fast read of a chunk either gives
// up or gives the text a full decode gives.
func TestPlainDeltaAgreesWithDecoding(t *testing.T) {
	chunks := []string{
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"word "},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"c","choices":[{"index":0,"delta":{"content":"quote \" and \\ and \u00e9 \ud83d\ude00"},"finish_reason":null}]}`,
		`{"id":"c","choices":[{"index":0,"delta":{"content":"a \"content\":\"fake\" inside"},"finish_reason":null}]}`,
		`{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
		`{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`,
		`{"id":"c","choices":[{"index":0,"delta":{"content":"x"},"logprobs":{"content":[]},"finish_reason":null}]}`,
		`{"id":"c","choices":[{"index":1,"delta":{"content":"x"},"finish_reason":null}]}`,
		`{"id":"c","choices":[{"index":0,"delta":{"content":"x"}},{"index":0,"delta":{"content":"y"}}]}`,
		`{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]},"finish_reason":null}]}`,
		`{"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}`,
		`{"id":"cmpl","object":"text_completion","choices":[{"index":0,"text":"tok ","logprobs":null,"finish_reason":null}]}`,
		`{"id":"c","choices":[{"index":0,"delta":{"content":null},"finish_reason":null}]}`,
		`{"id":"c","choices":[{"index":0,"delta":{"content":"cut`,
		// Python's json.dumps writes a blank after each colon and comma.
		`{"id": "c", "choices": [{"index": 0, "delta": {"content": "spaced"}, "finish_reason": null}]}`,
		`{"id" : "c", "choices" : [{"index" : 0, "delta" : {"content" : "spaced"}, "finish_reason" : "stop"}]}`,
		`{"id": "c", "choices": [{"index": 0, "delta": {"content": "x"}}], "usage": {"prompt_tokens": 1}}`,
		`{"id": "c", "choices": [{"index": 0, "delta": {"content": "x"}}], "usage": null}`,
		// A key's name as a value, and a value after a key's name.
		`{"id":"c","choices":[{"index":0,"delta":{"content":"role"},"finish_reason":null}]}`,
		`{"id":"c","choices":[{"index":0,"delta":{"content":"usage:"},"finish_reason":null}],"usage":{"completion_tokens":3}}`,
	}
	// The chunks a streaming engine sends for each token must take the
	// fast read, or it would be only a slower decode.
	mustBeFast := map[string]bool{chunks[0]: true, chunks[1]: true, chunks[2]: true, chunks[10]: true,
		chunks[11]: true, chunks[13]: true, chunks[16]: true}
	for _, ch := range chunks {
		fast, ok := plainDelta([]byte(ch))
		if !ok {
			if mustBeFast[ch] {
				t.Errorf("%s: not read fast", ch)
			}
			continue
		}
		var c carry
		c.on, c.known = true, true
		c.parts = 0
		var v chunkView
		if err := json.Unmarshal([]byte(ch), &v); err != nil {
			t.Errorf("%s: read fast as %q, but it is not JSON", ch, fast)
			continue
		}
		want := ""
		for _, choice := range v.Choices {
			if choice.Text != nil {
				want += *choice.Text
			}
			if choice.Delta != nil && choice.Delta.Content != nil {
				want += *choice.Delta.Content
			}
			if choice.FinishReason != nil || choice.Index != 0 || (choice.Delta != nil && choice.Delta.Role != "") {
				t.Errorf("%s: read fast, but it needs decoding", ch)
			}
		}
		if string(fast) != want {
			t.Errorf("%s: fast %q, decoded %q", ch, fast, want)
		}
	}
}

// resumeRequestJSON is resumeRequest as encoding/json decodes it: the
// oracle readResumeRequest is held to.
type resumeRequestJSON struct {
	N                   *int            `json:"n"`
	BestOf              *int            `json:"best_of"`
	Logprobs            json.RawMessage `json:"logprobs"`
	TopLogprobs         json.RawMessage `json:"top_logprobs"`
	Echo                bool            `json:"echo"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
}

func resumeBodies() []string {
	return []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":100}`,
		`{"model":"m","prompt":"once upon","max_completion_tokens":7,"echo":false}`,
		`{"model":"m","prompt":["a","b"],"n":2,"best_of":3}`,
		`{"model":"m","prompt":[1,2,3],"logprobs":5,"top_logprobs":null}`,
		`{"model":"m","messages":[],"logprobs":true,"top_logprobs":2}`,
		`{"N":2,"Max_Tokens":9,"ECHO":true,"Prompt":"x"}`,                        // keys fold, as encoding/json matches them
		`{"n":2,"n":null,"max_tokens":1,"max_tokens":5,"echo":true,"echo":null}`, // the last of duplicates
		`{"m\u0061x_tokens":3,"\u006e":1}`,                                       // escaped keys
		`{"n":"two"}`, `{"max_tokens":100.0}`, `{"echo":1}`, `{"best_of":-1}`,    // wrong types
		`{}`, ` { "n" : 1 , "prompt" : "p" } `, `{"messages":[{"n":5,"echo":true}]}`, // nested members are not top-level
		`[1]`, `"s"`, `null`, `{"n":1`, `{"n":1}x`,
	}
}

// checkResumeRequest: readResumeRequest reads body as encoding/json
// decodes it into the same fields, or both refuse it.
func checkResumeRequest(t *testing.T, body []byte) {
	var want resumeRequestJSON
	werr := json.Unmarshal(body, &want)
	got, gerr := readResumeRequest(body)
	if (werr != nil) != (gerr != nil) {
		t.Fatalf("%s: error %v, encoding/json %v", body, gerr, werr)
	}
	if werr != nil {
		return
	}
	g := resumeRequestJSON{got.N, got.BestOf, got.Logprobs, got.TopLogprobs, got.Echo, got.Prompt, got.MaxTokens, got.MaxCompletionTokens}
	gb, _ := json.Marshal(g)
	wb, _ := json.Marshal(want)
	if string(gb) != string(wb) {
		t.Fatalf("%s:\n got %s\nwant %s", body, gb, wb)
	}
}

func TestReadResumeRequestAgreesWithDecoding(t *testing.T) {
	for _, b := range resumeBodies() {
		checkResumeRequest(t, []byte(b))
	}
}

func FuzzReadResumeRequest(f *testing.F) {
	for _, b := range resumeBodies() {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		// The relay reads bodies the feature extraction validated.
		if !json.Valid(body) {
			return
		}
		checkResumeRequest(t, body)
	})
}

// BenchmarkNewCarry is what deciding whether a streamed answer can continue
// costs at its head, for a 256 KB conversation.
func BenchmarkNewCarry(b *testing.B) {
	turn := `{"role":"user","content":"` + strings.Repeat("lorem ipsum dolor sit amet ", 40) + `"}`
	var msgs []string
	for len(msgs)*len(turn) < 256<<10 {
		msgs = append(msgs, turn)
	}
	u := &upstream{endpoint: subjects.EndpointChat, model: "m",
		body: []byte(`{"model":"m","stream":true,"messages":[` + strings.Join(msgs, ",") + `],"max_tokens":100}`)}
	b.SetBytes(int64(len(u.body)))
	b.ReportAllocs()
	for b.Loop() {
		if c := newCarry(u, nil, ""); !c.on {
			b.Fatal(c.why)
		}
	}
}
