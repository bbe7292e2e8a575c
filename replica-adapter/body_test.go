package adapter

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func TestRewriteModel(t *testing.T) {
	tests := []struct {
		name, in, model, want string
	}{
		{"plain", `{"model":"chat-small","messages":[{"role":"user","content":"hi"}]}`, "team-x-v3",
			`{"model":"team-x-v3","messages":[{"role":"user","content":"hi"}]}`},
		{"model later, nested model untouched", `{"messages":[{"model":"x","content":"\"model\":"}],"model" : "a", "n":1}`, "b",
			`{"messages":[{"model":"x","content":"\"model\":"}],"model" : "b", "n":1}`},
		{"duplicates all rewritten", `{"model":"a","model":"c"}`, "b", `{"model":"b","model":"b"}`},
		{"escaped key", `{"mod\u0065l":"a"}`, "b", `{"mod\u0065l":"b"}`},
		{"non-string value", `{"model":null,"x":[1,{"y":"}"}]}`, "b", `{"model":"b","x":[1,{"y":"}"}]}`},
		{"missing", `{"prompt":"hi"}`, "b", `{"prompt":"hi","model":"b"}`},
		{"missing, empty object", ` { } `, "b", ` { "model":"b"} `},
		{"name needing escapes", `{"model":"a"}`, `q"\`, `{"model":"q\"\\"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := rewriteModel([]byte(tt.in), tt.model)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestRewriteModelUnchanged(t *testing.T) {
	in := []byte(`{"model":"same","prompt":"x"}`)
	got, err := rewriteModel(in, "same")
	if err != nil {
		t.Fatal(err)
	}
	if &got[0] != &in[0] {
		t.Error("a body already naming the model was copied")
	}
}

func TestRewriteModelRejects(t *testing.T) {
	for _, in := range []string{``, `[]`, `"model"`, `{"model":"a"`, `{"model" "a"}`, `{"model":"a"} x`, `{"a":[1,2}`, `{"a":"unterminated}`, `{model:1}`} {
		if _, err := rewriteModel([]byte(in), "b"); err == nil {
			t.Errorf("%q: want an error", in)
		}
	}
}

// FuzzRewriteModel checks the byte-level rewrite against encoding/json: a body
// that decodes as an object still decodes after the rewrite, with only
// "model" changed.
func FuzzRewriteModel(f *testing.F) {
	for _, s := range []string{`{"model":"a","messages":[{"role":"user","content":"hi"}]}`, `{}`, `{"x":{"model":"y"},"model":1}`, `{"a":"\\\"","model":"q"}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		var before map[string]any
		if json.Unmarshal([]byte(in), &before) != nil || before == nil {
			return
		}
		out, err := rewriteModel([]byte(in), "lora-1")
		if err != nil {
			t.Fatalf("rewrite of valid object %q: %v", in, err)
		}
		var after map[string]any
		if err := json.Unmarshal(out, &after); err != nil {
			t.Fatalf("rewrite of %q gave invalid JSON %q: %v", in, out, err)
		}
		if after["model"] != "lora-1" {
			t.Fatalf("rewrite of %q: model %v", in, after["model"])
		}
		delete(before, "model")
		delete(after, "model")
		if !reflect.DeepEqual(before, after) {
			t.Fatalf("rewrite of %q changed other fields: %q", in, out)
		}
	})
}

// BenchmarkRewriteModelLong is the adapter's only pass over a long prompt: find
// every top-level "model" and swap its value.
func BenchmarkRewriteModelLong(b *testing.B) {
	body := []byte(`{"model":"alias","stream":true,"messages":[{"role":"user","content":"` +
		strings.Repeat(`A long document line with an \"escaped quote\" and a break.\n`, 4400) + `"}]}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := rewriteModel(body, "llama-3-8b-instruct"); err != nil {
			b.Fatal(err)
		}
	}
}

// rewriteModel is setFields for "model" alone, as engineBody calls it for
// an embeddings body.
func rewriteModel(body []byte, name string) ([]byte, error) {
	quoted, _ := quote(name)
	out, _, err := setFields(body, []bodyField{{keys: []string{"model"}, value: quoted}})
	return out, err
}

// The engine's body goes out as parts: the prompt is the request
// message's own bytes, not a copy, and the parts make exactly what
// setFields returns whole.
func TestSetPartsKeepsThePromptInPlace(t *testing.T) {
	prompt := strings.Repeat("a long pasted document ", 4096)
	body := []byte(`{"model":"alias","messages":[{"role":"user","content":"` + prompt + `"}],"max_tokens":9}`)
	fields := []bodyField{{keys: []string{"model"}, value: []byte(`"served"`)},
		{keys: []string{"max_tokens"}, value: []byte("4")}, {keys: []string{"priority"}, value: []byte("2")}}
	parts, _, err := setParts(body, fields)
	if err != nil {
		t.Fatal(err)
	}
	whole, _, err := setFields(body, fields)
	if err != nil {
		t.Fatal(err)
	}
	if joined := bytes.Join(parts, nil); !bytes.Equal(joined, whole) || partsLen(parts) != int64(len(whole)) {
		t.Fatalf("parts make %q (%d bytes), setFields %q", joined, partsLen(parts), whole)
	}
	want := `{"model":"served","messages":[{"role":"user","content":"` + prompt + `"}],"max_tokens":4,"priority":2}`
	if string(whole) != want {
		t.Fatalf("body %.80q…, want %.80q…", whole, want)
	}
	inPlace := false
	for _, p := range parts {
		if len(p) > len(prompt) && &p[0] == &body[bytes.Index(body, []byte(`","messages"`))+1] {
			inPlace = true
		}
	}
	if !inPlace {
		t.Error("the prompt was copied: no part is the request body's own bytes")
	}
	// Read twice (a retry on a dead connection): each reader starts over.
	for range 2 {
		var got bytes.Buffer
		if _, err := got.ReadFrom(partsReader(parts)); err != nil || !bytes.Equal(got.Bytes(), whole) {
			t.Fatalf("read %d bytes (%v), want %d", got.Len(), err, len(whole))
		}
	}
}

// BenchmarkSetPartsLong is what engineBody costs on the same long body as
// BenchmarkRewriteModelLong, with the body left in parts.
func BenchmarkSetPartsLong(b *testing.B) {
	body := []byte(`{"model":"alias","stream":true,"messages":[{"role":"user","content":"` +
		strings.Repeat(`A long document line with an \"escaped quote\" and a break.\n`, 4400) + `"}]}`)
	fields := []bodyField{{keys: []string{"model"}, value: []byte(`"llama-3-8b-instruct"`)}}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := setParts(body, fields); err != nil {
			b.Fatal(err)
		}
	}
}
