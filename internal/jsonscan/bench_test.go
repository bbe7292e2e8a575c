package jsonscan_test

import (
	"strings"
	"testing"

	"github.com/switchyard-llm/switchyard/internal/jsonscan"
)

// longBody is a 256 KB chat body of the given lines: a pasted document,
// as long-context traffic looks.
func longBody(line string) []byte {
	return []byte(`{"model":"alias","stream":true,"max_tokens":256,"messages":[{"role":"user","content":"` +
		strings.Repeat(line, (256<<10)/len(line)) + `"}]}`)
}

// lines are two kinds of document: prose with a line break now and then,
// and text dense with escapes and accented letters, which the validator
// reads a byte at a time.
var lines = []struct{ name, line string }{
	{"prose", `Prefix affinity sends a conversation back to the replica that holds its cache, unless that replica is saturated.\n`},
	{"escapes", `A line with an \"escaped quote\", a break and déjà vu.\n`},
}

// BenchmarkValidate is the gateway's first pass over a long body.
func BenchmarkValidate(b *testing.B) {
	for _, l := range lines {
		body := longBody(l.line)
		b.Run(l.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				n := 0
				if _, ok := jsonscan.Validate(body, func(jsonscan.Key, []byte) { n++ }); !ok || n != 4 {
					b.Fatal("not valid")
				}
			}
		})
	}
}

// BenchmarkMembers is the adapter's pass over a long body: every top-level
// member found by skipping, strings quote to quote.
func BenchmarkMembers(b *testing.B) {
	for _, l := range lines {
		body := longBody(l.line)
		b.Run(l.name, func(b *testing.B) {
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
		})
	}
}
