package chunk

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"
)

// object decodes an object as a reader of the stream sees it: keys exactly
// (as Python's json reads them), the last of duplicates kept.
func object(v json.RawMessage) (map[string]json.RawMessage, bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(v, &m) != nil || m == nil {
		return nil, false
	}
	return m, true
}

func isNull(v json.RawMessage) bool { return v == nil || string(v) == "null" }

// decoded is Read's oracle: the same chunk read by decoding it whole with
// encoding/json. ok is false where Read must refuse the chunk.
func decoded(data []byte) (c Chunk, text string, ok bool) {
	top, ok := object(data)
	if !ok {
		return c, "", false
	}
	literal := func(v json.RawMessage) ([]byte, bool) {
		if isNull(v) {
			return nil, true
		}
		var s string
		return bytes.TrimSpace(v), json.Unmarshal(v, &s) == nil
	}
	if c.ID, ok = literal(top["id"]); !ok {
		return c, "", false
	}
	if c.Model, ok = literal(top["model"]); !ok {
		return c, "", false
	}
	if v, has := top["created"]; has {
		c.Created = bytes.TrimSpace(v)
	}
	if v, has := top["error"]; has {
		c.Error = !isNull(v)
	}
	if v := top["usage"]; !isNull(v) {
		u, ok := object(v)
		if !ok {
			return c, "", false
		}
		first := func(a, b string) (n int, has, ok bool) {
			v := u[a]
			if isNull(v) {
				v = u[b]
			}
			if isNull(v) {
				return 0, false, true
			}
			return n, true, json.Unmarshal(v, &n) == nil
		}
		var pok, cok bool
		c.Usage.PromptTokens, c.Usage.HasPrompt, pok = first("prompt_tokens", "input_tokens")
		c.Usage.CompletionTokens, c.Usage.HasCompletion, cok = first("completion_tokens", "output_tokens")
		if !pok || !cok || !(c.Usage.HasPrompt || c.Usage.HasCompletion) {
			return c, "", false
		}
		c.HasUsage = true
	}
	if v := top["choices"]; !isNull(v) {
		var choices []json.RawMessage
		if json.Unmarshal(v, &choices) != nil {
			return c, "", false
		}
		read := false
		for _, raw := range choices {
			ch, ok := object(raw)
			if !ok {
				return c, "", false
			}
			var s *string
			if v := ch["text"]; !isNull(v) {
				if json.Unmarshal(v, &s) != nil {
					return c, "", false
				}
			}
			var one Chunk
			one.Finish, one.Logprobs = !isNull(ch["finish_reason"]), !isNull(ch["logprobs"])
			if v := ch["delta"]; !isNull(v) {
				d, ok := object(v)
				if !ok {
					return c, "", false
				}
				if v := d["content"]; !isNull(v) {
					if json.Unmarshal(v, &s) != nil {
						return c, "", false
					}
				}
				nonEmpty := func(v json.RawMessage) bool { return !isNull(v) && string(bytes.TrimSpace(v)) != `""` }
				one.Role, one.ToolCalls, one.Reasoning = nonEmpty(d["role"]), !isNull(d["tool_calls"]), nonEmpty(d["reasoning_content"])
			}
			if read || !(isNull(ch["index"]) || string(bytes.TrimSpace(ch["index"])) == "0") {
				c.OtherChoices = true
				continue
			}
			read = true
			c.Finish, c.Logprobs, c.Role, c.ToolCalls, c.Reasoning = one.Finish, one.Logprobs, one.Role, one.ToolCalls, one.Reasoning
			if s != nil {
				text = *s
			}
		}
	}
	return c, text, true
}

// duplicateKeys reports whether an object in data names a key twice.
func duplicateKeys(data []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(data))
	type level struct {
		keys   map[string]bool
		object bool
		key    bool // the next string token is a key
	}
	var stack []level
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		top := len(stack) - 1
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{':
				if top >= 0 && stack[top].object {
					stack[top].key = true
				}
				stack = append(stack, level{keys: map[string]bool{}, object: true, key: true})
				continue
			case '[':
				if top >= 0 && stack[top].object {
					stack[top].key = true
				}
				stack = append(stack, level{})
				continue
			default:
				stack = stack[:top]
				continue
			}
		case string:
			if top >= 0 && stack[top].object && stack[top].key {
				if stack[top].keys[t] {
					return true
				}
				stack[top].keys[t], stack[top].key = true, false
				continue
			}
		}
		if top >= 0 && stack[top].object {
			stack[top].key = true
		}
	}
}

var seeds = []string{
	`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"word "},"logprobs":null,"finish_reason":null}]}`,
	`{"id":"c","choices":[{"index":0,"delta":{"content":"quote \" and \\ and \u00e9 \ud83d\ude00"},"finish_reason":null}]}`,
	`{"id":"c","choices":[{"index":0,"delta":{"content":"a \"content\":\"fake\" inside"},"finish_reason":null}]}`,
	`{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
	`{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`,
	`{"id":"c","choices":[{"index":0,"delta":{"content":"x"},"logprobs":{"content":[]},"finish_reason":null}]}`,
	`{"id":"c","choices":[{"index":1,"delta":{"content":"x"},"finish_reason":null}]}`,
	`{"id":"c","choices":[{"index":0,"delta":{"content":"x"}},{"index":0,"delta":{"content":"y"}}]}`,
	`{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]},"finish_reason":null}]}`,
	`{"id":"c","choices":[{"index":0,"delta":{"reasoning_content":"hmm"},"finish_reason":null}]}`,
	`{"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}`,
	`{"id":"cmpl","object":"text_completion","choices":[{"index":0,"text":"tok ","logprobs":null,"finish_reason":null}]}`,
	`{"id":"c","choices":[{"index":0,"delta":{"content":null},"finish_reason":null}]}`,
	`{"id":"c","choices":[{"index":0,"delta":{"content":"cut`,
	`{"id": "c", "choices": [{"index": 0, "delta": {"content": "spaced"}, "finish_reason": null}]}`,
	`{"id" : "c", "choices" : [{"index" : 0, "delta" : {"content" : "spaced"}, "finish_reason" : "stop"}]}`,
	`{"id": "c", "choices": [{"index": 0, "delta": {"content": "x"}}], "usage": {"prompt_tokens": 1}}`,
	`{"id": "c", "choices": [{"index": 0, "delta": {"content": "x"}}], "usage": null}`,
	`{"id":"c","choices":[{"index":0,"delta":{"content":"role"},"finish_reason":null}]}`,
	`{"id":"c","choices":[{"index":0,"delta":{"content":"usage:"},"finish_reason":null}],"usage":{"completion_tokens":3}}`,
	`{"type":"message_delta","usage":{"output_tokens":15}}`,
	`{"usage":{"input_tokens":10,"output_tokens":2,"prompt_tokens":null}}`,
	`{"usage":{"prompt_tokens":"9","completion_tokens":-4}}`,
	`{"usage":{"prompt_tokens":1.5}}`,
	`{"usage":{}}`,
	`{"error":{"message":"boom"}}`,
	`{"error":null,"id":"x","id":"y"}`,
	`{"id":7}`,
	`{"choices":{"index":0}}`,
	`{"choices":[1]}`,
	`{"choices":[{"delta":"x"}]}`,
	`{"choices":[{"index":0,"text":5}]}`,
	`{"mod\u0065l":"m","model":"n"}`,
	`{"ID":"folded keys are other keys"}`,
	`[1,2]`, `null`, `"s"`, `{}`, ` {} `, `{} x`, `{"a":<b>}`,
}

// check: Read agrees with the decoding oracle on data, or both refuse it.
func check(t *testing.T, data []byte) {
	t.Helper()
	want, wantText, wok := decoded(data)
	got, gok := Read(data)
	if !json.Valid(data) || duplicateKeys(data) {
		// Read skips what it does not need, so may take invalid JSON; and
		// of a key given twice, a decoder keeps the last value while Read
		// refuses a wrong type in either. Engines send neither.
		return
	}
	if gok != wok {
		t.Fatalf("%s: Read ok=%v, decoding ok=%v", data, gok, wok)
	}
	if !wok {
		return
	}
	if string(got.Text) != wantText {
		t.Fatalf("%s: text %q, decoded %q", data, got.Text, wantText)
	}
	got.Text, want.Text = nil, nil
	g, w := fmt.Sprintf("%+v", got), fmt.Sprintf("%+v", want)
	if !bytes.Equal(got.ID, want.ID) || !bytes.Equal(got.Model, want.Model) || !bytes.Equal(got.Created, want.Created) {
		t.Fatalf("%s:\n got %s\nwant %s", data, g, w)
	}
	if g != w {
		t.Fatalf("%s:\n got %s\nwant %s", data, g, w)
	}
}

func TestReadAgreesWithDecoding(t *testing.T) {
	for _, s := range seeds {
		check(t, []byte(s))
	}
}

func FuzzRead(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		check(t, data)
	})
}

// TestReadPlainChunkAllocatesNothing: the chunk a streaming engine sends
// for each token is read where it stands.
func TestReadPlainChunkAllocatesNothing(t *testing.T) {
	data := []byte(seeds[0])
	if n := testing.AllocsPerRun(100, func() { _, _ = Read(data) }); n != 0 {
		t.Fatalf("Read allocates %v times per plain chunk", n)
	}
}

func TestSplice(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"id":"a","x":1}`, `{"id":"b","x":1,"model":"m"}`},
		{`{"id":"a","id":"a2"}`, `{"id":"b","id":"b","model":"m"}`},
		{`{}`, `{"id":"b","model":"m"}`},
		{` { "x" : [1,{"id":"nested"}] } `, ` { "x" : [1,{"id":"nested"}] ,"id":"b","model":"m"} `},
	} {
		got, ok := Splice(nil, []byte(tc.in), []Member{{Key: "id", Value: []byte(`"b"`)}, {Key: "model", Value: []byte(`"m"`)}})
		if !ok || string(got) != tc.want {
			t.Errorf("Splice(%s) = %s, %v; want %s", tc.in, got, ok, tc.want)
		}
	}
	if _, ok := Splice(nil, []byte(`[1]`), nil); ok {
		t.Error("Splice took an array for an object")
	}
}

func BenchmarkRead(b *testing.B) {
	for _, s := range []string{seeds[0], seeds[10]} {
		data := []byte(s)
		b.Run(fmt.Sprintf("bytes=%d", len(data)), func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				_, _ = Read(data)
			}
		})
	}
}
