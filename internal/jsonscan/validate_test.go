package jsonscan_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/switchyard-llm/switchyard/internal/jsonscan"
)

// bodies are the shapes and refusals the validator must get right, beside
// whatever the fuzzers find.
func bodies() []string {
	return []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"a\"\\\/\n\t\u00e9\ud83d\ude00\ud800x"}]}`,
		` {"model" : "m" , "n" : [ 1 , 2.5e-3 , -0 , true , false , null , {} , [] ] } `,
		`{"MODEL":"m","mod\u0065l":"n","ſtream":true,"max_to\u212aens":5}`,
		`{"a":"` + strings.Repeat(`long line of text with \"quotes\" \\ and é\n`, 300) + `"}`,
		`[1,"two",{"three":3}]`, `"s"`, `12`, `-1.5E+3`, `true`, `false`, `null`, `{}`, `[]`,
		"{\"a\":\"\xff\"}", "{\"a\":\"\xed\xa0\x80\"}", "{\"a\xff\":1}",
		// Runs outside ASCII, whole, cut short or broken in the middle.
		`{"a":"中文文本 déjà vu 😀 ` + strings.Repeat("中文", 40) + `"}`, "{\"a\":\"中\xe4\xb8\"}", "{\"a\":\"中\xff文\"}",
		"\"\xe4\xb8", "\"中\x01文\"", "\"中\\u00e9文\"", "\"é\"",
		// Refusals.
		``, ` `, `{`, `{"a"`, `{"a":`, `{"a":1`, `{"a":1,}`, `{,}`, `{"a" 1}`, `{"a":1 "b":2}`, `{a:1}`,
		`[1,]`, `[,1]`, `[1 2]`, `01`, `1.`, `-`, `1e`, `.5`, `+1`, `tru`, `nul`, `True`, `"a`, `"\x"`, `"\u12"`,
		"\"a\x01\"", `{"a":1} x`, `{"a":1}}`, `[1]]`, "\xef\xbb\xbf{}", `{"a":[1}`, `{"a":{]}`,
		strings.Repeat("[", 10000) + strings.Repeat("]", 10000),
		strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
		`{"x":` + strings.Repeat(`{"y":`, 9999) + `1` + strings.Repeat(`}`, 9999) + `}`,
		`{"x":` + strings.Repeat(`{"y":`, 10000) + `1` + strings.Repeat(`}`, 10000) + `}`,
	}
}

func TestValidateAgreesWithEncodingJSON(t *testing.T) {
	for _, b := range bodies() {
		checkValidate(t, []byte(b))
	}
}

func FuzzValidate(f *testing.F) {
	for _, b := range bodies() {
		if len(b) < 4096 {
			f.Add([]byte(b))
		}
	}
	f.Fuzz(checkValidate)
}

// checkValidate compares Validate with encoding/json: the same verdict; on
// a valid body the top byte, invalid UTF-8 noticed exactly when the body has
// some (only strings may hold it), and the members of a top-level object
// those encoding/json decodes, in order.
func checkValidate(t *testing.T, b []byte) {
	var got []member
	r, ok := jsonscan.Validate(b, func(k jsonscan.Key, v []byte) {
		got = append(got, member{string(k.Quoted), string(v)})
		if k.Plain != (bytes.IndexByte(k.Quoted, '\\') < 0 && ascii(k.Quoted)) {
			t.Fatalf("%q: key %s reported plain %v", b, k.Quoted, k.Plain)
		}
	})
	if want := json.Valid(b); ok != want {
		t.Fatalf("%.200q: Validate %v, json.Valid %v", b, ok, want)
	}
	if ok != jsonscan.Valid(b) {
		t.Fatalf("%.200q: Valid disagrees with Validate", b)
	}
	if !ok {
		return
	}
	if top := bytes.TrimLeft(b, " \t\r\n")[0]; r.Top != top {
		t.Fatalf("%.200q: top %q, want %q", b, r.Top, top)
	}
	if r.BadUTF8 != !utf8.Valid(b) {
		t.Fatalf("%.200q: BadUTF8 %v", b, r.BadUTF8)
	}
	if r.Top != '{' {
		if len(got) > 0 {
			t.Fatalf("%.200q: members reported for a non-object", b)
		}
		return
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
}

// member is a key literal and its value, as they stand in the body.
type member struct{ key, value string }

// decodedMembers are the members of a valid object as encoding/json's
// token reader sees them: each key literal (re-read from the body at the
// token's offset) and each value's raw bytes.
func decodedMembers(t *testing.T, b []byte) []member {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	if _, err := d.Token(); err != nil { // '{'
		t.Fatal(err)
	}
	var out []member
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			t.Fatal(err)
		}
		// The key literal ends at InputOffset; find its opening quote.
		end := int(d.InputOffset())
		start := bytes.LastIndexByte(b[:end-1], '"')
		for start > 0 && oddBackslashes(b, start) {
			start = bytes.LastIndexByte(b[:start], '"')
		}
		var k string
		if json.Unmarshal(b[start:end], &k) != nil || k != tok.(string) {
			t.Fatalf("%.200q: lost the key literal at %d", b, end)
		}
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, member{string(b[start:end]), string(v)})
	}
	return out
}

// oddBackslashes reports whether the quote at b[q] is escaped.
func oddBackslashes(b []byte, q int) bool {
	n := 0
	for p := q - 1; p >= 0 && b[p] == '\\'; p-- {
		n++
	}
	return n%2 == 1
}

func ascii(b []byte) bool {
	for _, c := range b {
		if c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}
