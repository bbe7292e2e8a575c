package sse_test

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/switchyard-llm/switchyard/internal/sse"
)

func TestIsEventStream(t *testing.T) {
	for ct, want := range map[string]bool{
		"text/event-stream":                true,
		"text/event-stream; charset=utf-8": true,
		"Text/Event-Stream":                true,
		"text/event-streamer":              false,
		"application/json":                 false,
		"":                                 false,
		"text/event-stream; =broken":       false,
	} {
		if got := sse.IsEventStream(ct); got != want {
			t.Errorf("IsEventStream(%q) = %v, want %v", ct, got, want)
		}
	}
}

func TestReaderReadsFieldLines(t *testing.T) {
	in := ": keepalive\r\n\r\nevent: error\ndata: {\"a\":1}\n\ndata:{\"b\":2}\nid\ndata: " + strings.Repeat("x", 40) + "\ndata: [DONE]"
	r := sse.NewReader(strings.NewReader(in), 32)
	type got struct {
		field, value string
		cut, done    bool
	}
	want := []got{
		{"event", "error", false, false},
		{"data", `{"a":1}`, false, false},
		{"data", `{"b":2}`, false, false},
		{"id", "", false, false},
		{"data", strings.Repeat("x", 26), true, false}, // the first 32 bytes of the line
		{"data", "[DONE]", false, true},
	}
	for i, w := range want {
		l, err := r.Next()
		if err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
		if g := (got{l.Field, string(l.Value), l.Cut, l.Done()}); g != w {
			t.Errorf("line %d = %+v, want %+v", i, g, w)
		}
	}
	if _, err := r.Next(); !errors.Is(err, io.EOF) {
		t.Errorf("after the last line: %v, want EOF", err)
	}
}

func TestReaderPassesOnReadErrors(t *testing.T) {
	boom := errors.New("connection reset")
	r := sse.NewReader(io.MultiReader(strings.NewReader("data: 1\n"), errReader{boom}), 64)
	if l, err := r.Next(); err != nil || string(l.Value) != "1" {
		t.Fatalf("first line %q, %v", l.Value, err)
	}
	if _, err := r.Next(); !errors.Is(err, boom) {
		t.Fatalf("got %v, want the read error", err)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
