package jsonscan_test

import (
	"encoding/json"
	"testing"
	"unicode/utf8"

	"github.com/switchyard-llm/switchyard/internal/jsonscan"
)

// FuzzAppendString checks that the allocation-free string decoder agrees
// with encoding/json on every literal encoding/json accepts.
func FuzzAppendString(f *testing.F) {
	for _, s := range []string{
		`"plain"`, `"a\"b\\c\/d"`, `"\b\f\n\r\t"`, `"\u00e9\u4e2d"`, `"\ud83d\ude00"`,
		`"\ud800"`, `"\ud800\u0041"`, `"\udc00\ud800"`, `"\ud83d\ude00\ud83d"`, `""`, `"\u0000"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, lit []byte) {
		// A RawMessage holds the literal alone, never surrounding blanks.
		if !utf8.Valid(lit) || len(lit) < 2 || lit[0] != '"' || lit[len(lit)-1] != '"' {
			return
		}
		var want string
		if err := json.Unmarshal(lit, &want); err != nil {
			return
		}
		if got := jsonscan.AppendString(nil, lit); string(got) != want {
			t.Fatalf("%s: got %q, want %q", lit, got, want)
		}
	})
}
