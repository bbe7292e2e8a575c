package sse_test

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

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

// A stream whose lines end in a lone CR, longer than the reader's limit,
// reads line by line: a CR ends a line as an LF does, and a CRLF is one end.
func TestReaderEndsLinesAtCR(t *testing.T) {
	var in strings.Builder
	for i := range 200 {
		fmt.Fprintf(&in, "data: %d\r\r", i)
	}
	in.WriteString("data: crlf\r\n\r\ndata: [DONE]\r\r")
	r := sse.NewReader(strings.NewReader(in.String()), 32)
	for i := range 200 {
		l, err := r.Next()
		if err != nil || l.Field != "data" || string(l.Value) != strconv.Itoa(i) || l.Cut {
			t.Fatalf("line %d = %+v, %v", i, l, err)
		}
	}
	for _, want := range []string{"crlf", "[DONE]"} {
		if l, err := r.Next(); err != nil || string(l.Value) != want {
			t.Fatalf("got %+v, %v; want %q", l, err, want)
		}
	}
	if _, err := r.Next(); !errors.Is(err, io.EOF) {
		t.Errorf("after the last line: %v, want EOF", err)
	}
}

// A line is returned as soon as its end arrives, whether LF or CR, with
// nothing more written after it.
func TestReaderReturnsALineOnItsEnd(t *testing.T) {
	for _, end := range []string{"\n", "\r", "\r\n"} {
		pr, pw := io.Pipe()
		r := sse.NewReader(pr, 64)
		got := make(chan string, 1)
		go func() {
			l, err := r.Next()
			if err != nil {
				got <- err.Error()
				return
			}
			got <- string(l.Value)
		}()
		go func() { _, _ = io.WriteString(pw, "data: now"+end) }()
		select {
		case v := <-got:
			if v != "now" {
				t.Errorf("end %q: got %q", end, v)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("end %q: the line was not returned until more arrived", end)
		}
		pw.Close()
	}
}
