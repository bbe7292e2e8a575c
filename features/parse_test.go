package features_test

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/switchyard-llm/switchyard/features"
	"github.com/switchyard-llm/switchyard/subjects"
)

func le32(ids ...uint32) string {
	var b []byte
	for _, id := range ids {
		b = binary.LittleEndian.AppendUint32(b, id)
	}
	return string(b)
}

func TestParseRequest(t *testing.T) {
	chat, compl, emb := subjects.EndpointChat, subjects.EndpointCompletions, subjects.EndpointEmbeddings
	tests := []struct {
		name     string
		endpoint string
		body     string
		model    string
		prompt   string
		tokens   int
		exact    bool
		max      int // -1 = nil
		stream   bool
		usage    bool
	}{
		{"chat string content", chat, `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`,
			"m", "system\nbe brief\nuser\nhi\n", 6, false, -1, false, false},
		{"chat content parts", chat, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]}]}`,
			"m", "user\nab\n", 2, false, -1, false, false},
		{"chat null content", chat, `{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[]}]}`,
			"m", "assistant\n\n", 3, false, -1, false, false},
		{"escapes decoded", chat, `{"model":"m","messages":[{"role":"user","content":"a\"\\\/\n\t\u00e9\ud83d\ude00\ud800x"}]}`,
			"m", "user\na\"\\/\n\té😀\uFFFDx\n", 0, false, -1, false, false},
		{"stream with usage", chat, `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}]}`,
			"m", "user\nx\n", 2, false, -1, true, true},
		{"max_tokens", chat, `{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"x"}]}`,
			"m", "user\nx\n", 2, false, 100, false, false},
		{"max_completion_tokens wins", chat, `{"model":"m","max_tokens":100,"max_completion_tokens":7,"messages":[{"role":"user","content":"x"}]}`,
			"m", "user\nx\n", 2, false, 7, false, false},
		{"integral float max_tokens", chat, `{"model":"m","max_tokens":64.0,"messages":[{"role":"user","content":"x"}]}`,
			"m", "user\nx\n", 2, false, 64, false, false},
		{"null fields are absent", chat, `{"model":"m","stream":null,"max_tokens":null,"stream_options":null,"messages":[{"role":"user","content":"x"}]}`,
			"m", "user\nx\n", 2, false, -1, false, false},
		{"completions string", compl, `{"model":"m","prompt":"hello world"}`, "m", "hello world", 3, false, -1, false, false},
		{"completions strings joined", compl, `{"model":"m","prompt":["a","b"]}`, "m", "a\nb", 1, false, -1, false, false},
		{"completions token ids", compl, `{"model":"m","prompt":[1,2,300]}`, "m", le32(1, 2, 300), 3, true, -1, false, false},
		{"completions token id batches", compl, `{"model":"m","prompt":[[1,2],[3]]}`, "m", le32(1, 2, 3), 3, true, -1, false, false},
		{"embeddings input", emb, `{"model":"e","input":"abc"}`, "e", "abc", 1, false, -1, false, false},
		{"any endpoint prefers messages", "", `{"model":"m","prompt":"p","messages":[{"role":"user","content":"c"}]}`, "m", "user\nc\n", 2, false, -1, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := features.ParseRequest(tc.endpoint, []byte(tc.body))
			if err != nil {
				t.Fatalf("ParseRequest: %v", err)
			}
			if r.Model != tc.model || string(r.Prompt) != tc.prompt {
				t.Fatalf("model %q prompt %q, want %q %q", r.Model, r.Prompt, tc.model, tc.prompt)
			}
			if tc.tokens != 0 && r.PromptTokens != tc.tokens || r.ExactTokens != tc.exact {
				t.Fatalf("tokens %d exact %v, want %d %v", r.PromptTokens, r.ExactTokens, tc.tokens, tc.exact)
			}
			if !tc.exact && r.PromptTokens != features.EstimateTokens(len(r.Prompt)) {
				t.Fatalf("estimate %d for %d bytes", r.PromptTokens, len(r.Prompt))
			}
			switch {
			case tc.max < 0 && r.MaxTokens != nil:
				t.Fatalf("MaxTokens = %d, want nil", *r.MaxTokens)
			case tc.max >= 0 && (r.MaxTokens == nil || *r.MaxTokens != tc.max):
				t.Fatalf("MaxTokens = %v, want %d", r.MaxTokens, tc.max)
			}
			if r.Stream != tc.stream || r.IncludeUsage != tc.usage {
				t.Fatalf("stream %v usage %v", r.Stream, r.IncludeUsage)
			}
		})
	}
}

func TestParseRequestErrors(t *testing.T) {
	chat, compl := subjects.EndpointChat, subjects.EndpointCompletions
	msg := `"messages":[{"role":"user","content":"x"}]`
	tests := []struct {
		name, endpoint, body, param string
	}{
		{"malformed JSON", chat, `{"model":`, ""},
		{"trailing data", chat, `{"model":"m",` + msg + `} x`, ""},
		{"not an object", chat, `["model"]`, ""},
		{"missing model", chat, `{` + msg + `}`, "model"},
		{"empty model", chat, `{"model":"",` + msg + `}`, "model"},
		{"model not a string", chat, `{"model":3,` + msg + `}`, "model"},
		{"model over 128 characters", chat, `{"model":"` + strings.Repeat("m", 129) + `",` + msg + `}`, "model"},
		{"several answers", chat, `{"model":"m","n":2,` + msg + `}`, "n"},
		{"best_of", "/v1/completions", `{"model":"m","prompt":"x","best_of":3}`, "best_of"},
		{"stream not a bool", chat, `{"model":"m","stream":"yes",` + msg + `}`, "stream"},
		{"stream_options not an object", chat, `{"model":"m","stream_options":1,` + msg + `}`, "stream_options"},
		{"include_usage not a bool", chat, `{"model":"m","stream_options":{"include_usage":1},` + msg + `}`, "stream_options.include_usage"},
		{"negative max_tokens", chat, `{"model":"m","max_tokens":-1,` + msg + `}`, "max_tokens"},
		{"zero max_tokens", chat, `{"model":"m","max_tokens":0,` + msg + `}`, "max_tokens"},
		{"zero max_output_tokens", "/v1/responses", `{"model":"m","input":"x","max_output_tokens":0}`, "max_output_tokens"},
		{"absurd max_tokens", chat, `{"model":"m","max_tokens":1048577,` + msg + `}`, "max_tokens"},
		{"fractional max_tokens", chat, `{"model":"m","max_tokens":1.5,` + msg + `}`, "max_tokens"},
		{"string max_completion_tokens", chat, `{"model":"m","max_completion_tokens":"9",` + msg + `}`, "max_completion_tokens"},
		{"missing messages", chat, `{"model":"m"}`, "messages"},
		{"empty messages", chat, `{"model":"m","messages":[]}`, "messages"},
		{"messages not an array", chat, `{"model":"m","messages":{}}`, "messages"},
		{"message not an object", chat, `{"model":"m","messages":["hi"]}`, "messages[0]"},
		{"missing role", chat, `{"model":"m","messages":[{"content":"x"}]}`, "messages[0].role"},
		{"content a number", chat, `{"model":"m","messages":[{"role":"user","content":1}]}`, "messages[0].content"},
		{"part text not a string", chat, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":1}]}]}`, "messages[0].content[0].text"},
		{"part without type", chat, `{"model":"m","messages":[{"role":"user","content":[{"text":"a"}]}]}`, "messages[0].content[0].type"},
		{"invalid UTF-8", chat, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}", "messages"},
		{"missing prompt", compl, `{"model":"m"}`, "prompt"},
		{"empty prompt array", compl, `{"model":"m","prompt":[]}`, "prompt"},
		{"mixed prompt array", compl, `{"model":"m","prompt":["a",1]}`, "prompt[1]"},
		{"negative token id", compl, `{"model":"m","prompt":[1,-2]}`, "prompt[1]"},
		{"empty token batch", compl, `{"model":"m","prompt":[[1],[]]}`, "prompt[1]"},
		{"prompt an object", compl, `{"model":"m","prompt":{}}`, "prompt"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := features.ParseRequest(tc.endpoint, []byte(tc.body))
			var pe *features.ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v, want a *ParseError", err)
			}
			if pe.Param != tc.param {
				t.Fatalf("param %q, want %q (%v)", pe.Param, tc.param, err)
			}
			a := pe.APIError()
			if a.Status != 400 || a.Code != subjects.CodeInvalidRequest || a.Param != tc.param {
				t.Fatalf("APIError %+v", a)
			}
		})
	}
}

func TestParseRequestIntoReusesBuffer(t *testing.T) {
	r := &features.Request{Prompt: make([]byte, 0, 64)}
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hello"}]}`)
	if err := features.ParseRequestInto(r, subjects.EndpointChat, body); err != nil {
		t.Fatal(err)
	}
	first := &r.Prompt[0]
	if err := features.ParseRequestInto(r, subjects.EndpointChat, body); err != nil {
		t.Fatal(err)
	}
	if &r.Prompt[0] != first || string(r.Prompt) != "user\nhello\n" {
		t.Fatalf("buffer not reused or prompt wrong: %q", r.Prompt)
	}
}

func TestEstimateTokens(t *testing.T) {
	for n, want := range map[int]int{0: 0, 1: 1, 4: 1, 5: 2, 400: 100, 401: 101} {
		if got := features.EstimateTokens(n); got != want {
			t.Errorf("EstimateTokens(%d) = %d, want %d", n, got, want)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a\u00e9\ud83d\ude00"}]}],"stream":true}`,
		`{"model":"m","prompt":[[1,2],[3]],"max_tokens":5}`,
		`{"model":"m","prompt":["a","b"],"max_completion_tokens":1e3}`,
		`{"model":"m","input":"x","stream_options":{"include_usage":false}}`,
		`{"model":"m","messages":[{"role":"user","content":"\ud800\u0041"}]}`,
		`{`, `null`, `[]`, "\"\xff\"",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := features.ParseRequest("", b)
		if err != nil {
			var pe *features.ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %v is not a *ParseError", err)
			}
			return
		}
		if r.Model == "" {
			t.Fatal("accepted a request without a model")
		}
		if r.MaxTokens != nil && (*r.MaxTokens < 0 || *r.MaxTokens > features.MaxTokensLimit) {
			t.Fatalf("max tokens %d out of range", *r.MaxTokens)
		}
		if !r.ExactTokens && r.PromptTokens != features.EstimateTokens(len(r.Prompt)) {
			t.Fatal("estimate does not match the prompt")
		}
		if r.ExactTokens && len(r.Prompt) != 4*r.PromptTokens {
			t.Fatalf("%d token ids rendered to %d bytes", r.PromptTokens, len(r.Prompt))
		}
		if !r.ExactTokens && r.HasMessages && !strings.HasSuffix(string(r.Prompt), "\n") {
			t.Fatalf("chat prompt %q does not end with a newline", r.Prompt)
		}
	})
}
