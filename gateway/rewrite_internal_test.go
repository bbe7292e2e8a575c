package gateway

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
	"testing"

	"github.com/switchyard-llm/switchyard/internal/sse"
)

// rewriteByMap is the rewrite as a decode into a map and a marshal back:
// what the splice must agree with, value for value.
func (c *carry) rewriteByMap(data []byte, usage bool) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(data, &m) != nil || m == nil {
		return sseEvent("", data)
	}
	m["id"], m["model"] = c.id, c.model
	if len(c.model) == 0 {
		m["model"] = []byte(`""`)
	}
	if len(c.created) > 0 {
		m["created"] = c.created
	}
	if usage {
		var u map[string]json.RawMessage
		if json.Unmarshal(m["usage"], &u) == nil && u != nil {
			var prompt, completion int
			_ = json.Unmarshal(u["prompt_tokens"], &prompt)
			_ = json.Unmarshal(u["completion_tokens"], &completion)
			prompt = max(prompt-c.tokens, 0)
			completion += c.tokens
			u["prompt_tokens"] = json.RawMessage(strconv.Itoa(prompt))
			u["completion_tokens"] = json.RawMessage(strconv.Itoa(completion))
			u["total_tokens"] = json.RawMessage(strconv.Itoa(prompt + completion))
			m["usage"], _ = json.Marshal(u)
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		return sseEvent("", data)
	}
	return sseEvent("", b)
}

var rewriteSeeds = []string{
	`{"id":"cmpl-2","object":"chat.completion.chunk","created":1700000099,"model":"served","choices":[{"index":0,"delta":{"content":"more"},"finish_reason":null}]}`,
	`{"id":"cmpl-2","created":5,"model":"served","choices":[],"usage":{"prompt_tokens":120,"completion_tokens":7,"total_tokens":127}}`,
	`{"choices":[],"usage":{"completion_tokens":3}}`,
	`{"usage":{}}`,
	`{"usage":null,"id":"x"}`,
	`{}`,
	` { "id" : "a" , "id":"b", "mod\u0065l":"m", "usage":{"prompt_tokens":1.5,"prompt_tokens":2} } `,
	`{"usage":{"prompt_tokens":"9","completion_tokens":-4}}`,
	`[1,2]`,
	`null`,
	`{"a":<b>}`,
	`{"id":"<&>"}`,
}

// TestRewriteAgreesWithReMarshal: the splice and a decode-and-marshal give
// the client the same chunk, read as JSON.
func TestRewriteAgreesWithReMarshal(t *testing.T) {
	for _, s := range rewriteSeeds {
		checkRewrite(t, []byte(s), 5)
	}
}

func FuzzRewriteAgreesWithReMarshal(f *testing.F) {
	for _, s := range rewriteSeeds {
		f.Add([]byte(s), 5)
	}
	f.Fuzz(func(t *testing.T, data []byte, carried int) {
		checkRewrite(t, data, carried)
	})
}

func checkRewrite(t *testing.T, data []byte, carried int) {
	t.Helper()
	c := &carry{id: []byte(`"cmpl-1"`), model: []byte(`"public <model>"`), created: []byte("1700000000"), tokens: carried}
	for _, usage := range []bool{false, true} {
		got, want := sse.Data(c.rewrite(data, usage)), sse.Data(c.rewriteByMap(data, usage))
		var g, w any
		gerr, werr := json.Unmarshal(got, &g), json.Unmarshal(want, &w)
		if (gerr == nil) != (werr == nil) || !reflect.DeepEqual(g, w) {
			if gerr != nil && werr != nil && bytes.Equal(got, want) {
				continue // both left a chunk that is not JSON as it was
			}
			t.Fatalf("rewrite(%q, usage=%v):\n splice %s\n   map  %s", data, usage, got, want)
		}
	}
}
