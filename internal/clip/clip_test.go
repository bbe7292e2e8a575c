package clip_test

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/switchyard-llm/switchyard/internal/clip"
)

func TestText(t *testing.T) {
	tests := []struct {
		name string
		s    string
		n    int
		want string
	}{
		{"short", "abc", 8, "abc"},
		{"exact", "abcdefgh", 8, "abcdefgh"},
		{"empty", "", 0, ""},
		{"cut", "abcdefghij", 8, "abcde…"},
		{"cut before a character's last byte", "abcdé", 5, "ab…"},
		{"cut within a character", "ééééé", 8, "éé…"},
		{"no room for the mark", "abcdef", 2, "ab"},
		{"no room for a character", "ééé", 1, ""},
		{"zero", "abc", 0, ""},
		{"negative", "abc", -1, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := clip.Text(tt.s, tt.n)
			if got != tt.want {
				t.Errorf("Text(%q, %d) = %q, want %q", tt.s, tt.n, got, tt.want)
			}
			if b := clip.Text([]byte(tt.s), tt.n); b != tt.want {
				t.Errorf("Text([]byte(%q), %d) = %q, want %q", tt.s, tt.n, b, tt.want)
			}
		})
	}
}

// TestTextBound: whatever is sent, the result is at most n bytes of valid
// UTF-8 when the text was.
func TestTextBound(t *testing.T) {
	s := strings.Repeat("aé€😀", 50)
	for n := range len(s) + 2 {
		got := clip.Text(s, n)
		if len(got) > max(n, 0) || !utf8.ValidString(got) {
			t.Fatalf("Text(…, %d) = %d bytes %q", n, len(got), got)
		}
		if n < len(s) && n >= len(clip.Ellipsis) && !strings.HasSuffix(got, clip.Ellipsis) {
			t.Fatalf("Text(…, %d) = %q: cut without the mark", n, got)
		}
		if !strings.HasPrefix(s, strings.TrimSuffix(got, clip.Ellipsis)) {
			t.Fatalf("Text(…, %d) = %q: not a start of the text", n, got)
		}
	}
}

func ExampleText() {
	fmt.Println(clip.Text("a model name far too long to log", 12))
	// Output: a model n…
}
