package jsonscan_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/switchyard-llm/switchyard/internal/jsonscan"
)

func TestMembers(t *testing.T) {
	b := []byte(` { "model" : "a" , "messages":[{"model":"x","content":"\"model\":"}],"mod\u0065l":null, "x":[1,{"y":"}"}]} `)
	want := []member{
		{`"model"`, `"a"`},
		{`"messages"`, `[{"model":"x","content":"\"model\":"}]`},
		{`"mod\u0065l"`, `null`},
		{`"x"`, `[1,{"y":"}"}]`},
	}
	m := jsonscan.NewMembers(b, 1)
	var got []member
	for m.Next() {
		from, to := m.Span()
		if string(b[from:to]) != string(m.Value()) {
			t.Fatalf("span %d:%d is not the value %s", from, to, m.Value())
		}
		got = append(got, member{string(m.Key().Quoted), string(m.Value())})
	}
	if len(got) != len(want) {
		t.Fatalf("got %q", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("member %d: got %q, want %q", i, got[i], want[i])
		}
	}
	if m.End() != len(b)-1 {
		t.Errorf("end %d, want %d", m.End(), len(b)-1)
	}
	if m.Next() {
		t.Error("Next after the end")
	}
}

// TestMembersRejects: punctuation the engine would refuse ends the walk
// with End -1, never with an index outside the input.
func TestMembersRejects(t *testing.T) {
	for _, in := range []string{``, ` `, `[]`, `"model"`, `{`, `{"model":"a"`, `{"model" "a"}`, `{"model":"a" "b":1}`,
		`{"a":[1,2}`, `{"a":"unterminated}`, `{model:1}`, `{"a":1,}`, `{,}`, `{"a":}`, `{"a"`, `{"a":`, `{"a\"}`} {
		m := jsonscan.NewMembers([]byte(in), jsonscan.SkipSpace([]byte(in), 0))
		for m.Next() {
		}
		if m.End() >= 0 {
			t.Errorf("%q: end %d, want -1", in, m.End())
		}
	}
}

func TestElems(t *testing.T) {
	b := []byte(`[ 1 ,"a\"]", [2,[3]] , {"k":"]"},null]`)
	want := []string{`1`, `"a\"]"`, `[2,[3]]`, `{"k":"]"}`, `null`}
	e := jsonscan.NewElems(b, 0)
	var got []string
	for e.Next() {
		got = append(got, string(e.Value()))
	}
	if len(got) != len(want) || e.End() != len(b) {
		t.Fatalf("got %q, end %d", got, e.End())
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("element %d: got %s, want %s", i, got[i], want[i])
		}
	}
	for _, in := range []string{`[`, `[1`, `[1,`, `[1 2]`, `[,]`, `{}`, `[1,]`} {
		e := jsonscan.NewElems([]byte(in), 0)
		for e.Next() {
		}
		if e.End() >= 0 {
			t.Errorf("%q: end %d, want -1", in, e.End())
		}
	}
}

func TestLookup2Fold(t *testing.T) {
	obj := []byte(`{"ROLE":"user","role":"system","Content":"x","te\u0078t":1,"other":2}`)
	role, content := jsonscan.Lookup2Fold(obj, "role", "content")
	if string(role) != `"system"` || string(content) != `"x"` {
		t.Errorf("role %s content %s", role, content)
	}
	if typ, text := jsonscan.Lookup2Fold(obj, "type", "text"); typ != nil || string(text) != `1` {
		t.Errorf("type %s text %s", typ, text)
	}
}

func TestNextMember(t *testing.T) {
	tests := []struct {
		in   string
		want string // key=value-start pairs, then "end" or "cut"
	}{
		{`{"a":1,"b":{"c":"d"}}`, `"a"=1 "b"={ "c"=" end`},
		{`{"text":"say \"usage\": 1","n" : null}`, `"text"=" "n"=n end`},
		{`["usage", "x" ,"y"]`, `end`},
		{`{"a":"b\\","c":2}`, `"a"=" "c"=2 end`},
		{`{"a":"cut`, `"a"=" cut`},
		{`{"a": `, `cut`},
		{`{"a":1,"b"`, `"a"=1 end`},
		{``, `end`},
	}
	for _, tt := range tests {
		b := []byte(tt.in)
		var got []string
		for i := 0; ; {
			key, v := jsonscan.NextMember(b, i)
			if key == nil {
				if v < 0 {
					got = append(got, "cut")
				} else if v != len(b) {
					got = append(got, "bad end")
				} else {
					got = append(got, "end")
				}
				break
			}
			got = append(got, string(key)+"="+string(b[v:v+1]))
			i = v
		}
		if g := strings.Join(got, " "); g != tt.want {
			t.Errorf("%s: %s, want %s", tt.in, g, tt.want)
		}
	}
}

func TestLastMember(t *testing.T) {
	b := []byte(`{"usage":{"n":1},"x":"usage","usage": 2,"usage"}`)
	k, v := jsonscan.LastMember(b, `"usage"`, len(b))
	if k < 0 || string(b[v:v+1]) != "2" {
		t.Fatalf("LastMember: key %d value %d", k, v)
	}
	k, v = jsonscan.LastMember(b, `"usage"`, k)
	if k != 1 || b[v] != '{' {
		t.Fatalf("LastMember before: key %d value %d", k, v)
	}
	if k, v = jsonscan.LastMember(b, `"usage"`, k); k != -1 || v != -1 {
		t.Fatalf("LastMember before the first: key %d value %d", k, v)
	}
}

func FuzzSkipMatchesDecoding(f *testing.F) {
	for _, b := range bodies() {
		if len(b) < 4096 {
			f.Add([]byte(b))
		}
	}
	f.Fuzz(checkSkip)
}

func TestSkipMatchesDecoding(t *testing.T) {
	for _, b := range bodies() {
		checkSkip(t, []byte(b))
	}
}

// checkSkip compares the skippers with encoding/json on a valid body: the
// top-level value ends where the blanks before the end begin, and the
// members of an object or the elements of an array are those encoding/json
// decodes. On any body, no offset leaves the input.
func checkSkip(t *testing.T, b []byte) {
	i := jsonscan.SkipSpace(b, 0)
	end := jsonscan.ValueEnd(b, i)
	if end > len(b) || (end >= 0 && end <= i) {
		t.Fatalf("%.200q: value end %d", b, end)
	}
	var got []member
	m := jsonscan.NewMembers(b, i)
	for m.Next() {
		from, to := m.Span()
		if from < i || to > len(b) || from >= to {
			t.Fatalf("%.200q: member span %d:%d", b, from, to)
		}
		got = append(got, member{string(m.Key().Quoted), string(m.Value())})
	}
	var elems []string
	e := jsonscan.NewElems(b, i)
	for e.Next() {
		elems = append(elems, string(e.Value()))
	}
	if !json.Valid(b) {
		return
	}
	if jsonscan.SkipSpace(b, end) != len(b) {
		t.Fatalf("%.200q: value ends at %d", b, end)
	}
	switch b[i] {
	case '{':
		if m.End() != end {
			t.Fatalf("%.200q: members end at %d, the value at %d", b, m.End(), end)
		}
		want := decodedMembers(t, b)
		if len(got) != len(want) {
			t.Fatalf("%.200q: %d members, encoding/json decodes %d", b, len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%.200q: member %d is %q, encoding/json reads %q", b, i, got[i], want[i])
			}
		}
	case '[':
		var want []json.RawMessage
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatal(err)
		}
		if e.End() != end || len(elems) != len(want) {
			t.Fatalf("%.200q: %d elements ending at %d, encoding/json decodes %d", b, len(elems), e.End(), len(want))
		}
		for i := range want {
			if !bytes.Equal([]byte(elems[i]), want[i]) {
				t.Fatalf("%.200q: element %d is %s, encoding/json reads %s", b, i, elems[i], want[i])
			}
		}
	}
}
