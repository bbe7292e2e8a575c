package jsonscan_test

import (
	"strings"
	"testing"

	"github.com/switchyard-llm/switchyard/internal/jsonscan"
)

// longBody is a 256 KB chat body: a pasted document of prose lines with
// escapes, as long-context traffic looks.
func longBody() []byte {
	line := `A long document line with an \"escaped quote\", a break and déjà vu.\n`
	return []byte(`{"model":"alias","stream":true,"max_tokens":256,"messages":[{"role":"user","content":"` +
		strings.Repeat(line, (256<<10)/len(line)) + `"}]}`)
}

// BenchmarkValidate is the gateway's first pass over a long body.
func BenchmarkValidate(b *testing.B) {
	body := longBody()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		n := 0
		if _, ok := jsonscan.Validate(body, func(jsonscan.Key, []byte) { n++ }); !ok || n != 4 {
			b.Fatal("not valid")
		}
	}
}

// BenchmarkMembers is the adapter's pass over a long body: every top-level
// member found by skipping, strings quote to quote.
func BenchmarkMembers(b *testing.B) {
	body := longBody()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		m := jsonscan.NewMembers(body, 0)
		for m.Next() {
		}
		if m.End() != len(body) {
			b.Fatal("malformed")
		}
	}
}
