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
