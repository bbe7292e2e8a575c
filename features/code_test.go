package features_test

import (
	"strings"
	"testing"

	"github.com/switchyard-llm/switchyard/features"
)

func TestIsCode(t *testing.T) {
	tests := []struct {
		name   string
		prompt string
		code   bool
	}{
		{"fenced block", "user\nwhy does this fail?\n```\nx = 1\n```\n", true},
		{"python", "user\nfix this:\ndef f(x):\n    import os\n    return x\n", true},
		{"go", "user\nfunc main() {\n\tfmt.Println(1)\n}\nvar x = 2\n", true},
		{"c", "#include <stdio.h>\nint main() {\n  printf(\"hi\");\n", true},
		{"javascript arrows", "const f = (a) => a\nlet g = () => 1\nxs.map(x => x*2)\n", true},
		{"prose", "user\nWrite a poem about the sea.\nMake it rhyme.\nThank you!\n", false},
		{"two code lines are not enough", "user\nwhat does `def f():` mean\nimport this;\n", false},
		{"empty", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := features.IsCode([]byte(tc.prompt)); got != tc.code {
				t.Fatalf("IsCode = %v, want %v", got, tc.code)
			}
			want := ""
			if tc.code {
				want = features.FeatureCode
			}
			if got := features.Flags([]byte(tc.prompt)); got != want {
				t.Fatalf("Flags = %q, want %q", got, want)
			}
			if got := strings.Join(features.AppendFlags(nil, []byte(tc.prompt)), ","); got != want {
				t.Fatalf("AppendFlags = %q, want %q", got, want)
			}
		})
	}
}

func BenchmarkIsCode(b *testing.B) {
	p := []byte(strings.Repeat("This is a long line of ordinary prose about nothing in particular.\n", 200))
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for b.Loop() {
		if features.IsCode(p) {
			b.Fatal("prose detected as code")
		}
	}
}
