package sse_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/switchyard-llm/switchyard/internal/sse"
)

// split cuts a stream into events, written in the given parts.
func split(t *testing.T, s *sse.Events, parts ...string) []string {
	t.Helper()
	var got []string
	for _, p := range parts {
		err := s.Write([]byte(p), func(ev []byte) error { got = append(got, string(ev)); return nil })
		if err != nil {
			t.Fatal(err)
		}
	}
	return got
}

// TestEventsHandOnOnlyWholeEvents feeds a stream cut at every byte, and
// byte by byte: the events come out whole and in order, whatever the cut,
// and what is left held is the incomplete last event.
func TestEventsHandOnOnlyWholeEvents(t *testing.T) {
	want := []string{
		"data: {\"a\":1}\n\n",
		": comment\n\n",
		"event: x\ndata: 2\r\n\r\n",
		"data: 3\r\r",
		"data: 4\r\n\n",      // CRLF then LF
		"data: 5\n\r\n",      // LF then CRLF
		"data: 6\r\r\n",      // CR then CRLF
		"id: 7\rdata: 7\n\r", // CR inside, LF then CR
		"data:8\ndata:9\n\n", // one event, two data lines
	}
	partial := `data: {"partial"`
	stream := strings.Join(want, "") + partial
	check := func(name string, s *sse.Events, got []string) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Fatalf("%s: %q,\nwant %q", name, got, want)
		}
		if string(s.Pending()) != partial {
			t.Fatalf("%s: %q held, want the partial event", name, s.Pending())
		}
	}
	for cut := 1; cut < len(stream); cut++ {
		var s sse.Events
		check(fmt.Sprint("cut at ", cut), &s, split(t, &s, stream[:cut], stream[cut:]))
	}
	var s sse.Events
	var bytewise []string
	for i := range len(stream) {
		bytewise = append(bytewise, split(t, &s, stream[i:i+1])...)
	}
	check("byte by byte", &s, bytewise)
}

// A CR ending an event may be the first half of a CRLF: the event waits
// for the next byte to know, so the LF is never handed on alone.
func TestEventsWaitForTheLFOfACR(t *testing.T) {
	var s sse.Events
	if got := split(t, &s, "data: 1\r\n\r"); len(got) != 0 {
		t.Fatalf("handed on %q before its terminator was known", got)
	}
	if got := split(t, &s, "\ndata: 2\r\r"); !slices.Equal(got, []string{"data: 1\r\n\r\n"}) {
		t.Fatalf("got %q", got)
	}
	if got := split(t, &s, "data: 3\n\n"); !slices.Equal(got, []string{"data: 2\r\r", "data: 3\n\n"}) {
		t.Fatalf("got %q", got)
	}
}

func TestEventsBoundAnEvent(t *testing.T) {
	for name, parts := range map[string][]string{
		"held":  {"data: ", strings.Repeat("x", sse.MaxEvent)},
		"whole": {"data: " + strings.Repeat("x", sse.MaxEvent) + "\n\n"},
	} {
		var s sse.Events
		var err error
		for _, p := range parts {
			if err = s.Write([]byte(p), func([]byte) error { return nil }); err != nil {
				break
			}
		}
		if !errors.Is(err, sse.ErrEventTooLarge) || len(s.Pending()) != 0 {
			t.Fatalf("%s: oversized event: %v, %d held", name, err, len(s.Pending()))
		}
	}
}

// An observer skips an oversized event and reads on: the events around it
// come out whole, and no more than the bound is ever held.
func TestEventsSkipAnOversizedEvent(t *testing.T) {
	const limit = 64
	big := "data: " + strings.Repeat("x", 3*limit)
	stream := "data: 1\n\n" + big + "\r\n\r\n" + "data: 2\n\n" + big + "\n\n" + "data: 3\n\n"
	want := []string{"data: 1\n\n", "data: 2\n\n", "data: 3\n\n"}
	for _, step := range []int{1, 2, 7, limit - 1, limit, limit + 1, 3 * limit, len(stream)} {
		s := sse.Events{Max: limit, SkipOversized: true}
		var got []string
		for i := 0; i < len(stream); i += step {
			got = append(got, split(t, &s, stream[i:min(i+step, len(stream))])...)
			if len(s.Pending()) > limit+step {
				t.Fatalf("step %d: %d bytes held", step, len(s.Pending()))
			}
		}
		if !slices.Equal(got, want) || len(s.Pending()) != 0 {
			t.Fatalf("step %d: %q (%q held), want %q", step, got, s.Pending(), want)
		}
	}
	// Cut off inside the oversized event: nothing of it is pending.
	s := sse.Events{Max: limit, SkipOversized: true}
	split(t, &s, big)
	if s.Pending() != nil {
		t.Fatalf("the tail of an oversized event is pending: %q", s.Pending())
	}
}

func TestEventsStopOnEmitError(t *testing.T) {
	var s sse.Events
	boom := errors.New("client gone")
	n := 0
	err := s.Write([]byte("data: 1\n\ndata: 2\n\ndata: 3"), func([]byte) error { n++; return boom })
	if !errors.Is(err, boom) || n != 1 || len(s.Pending()) != 0 {
		t.Fatalf("err %v after %d events, %q held", err, n, s.Pending())
	}
}

func TestData(t *testing.T) {
	for ev, want := range map[string]string{
		"data: {}\n\n":                 "{}",
		"data: {}\r\n\r\n":             "{}",
		"data:{}\r\r":                  "{}",
		"data:  two spaces\n\n":        " two spaces",
		"data:x\ndata: y\n\n":          "x\ny",
		"data: x\rdata: y\r\ndata\n\n": "x\ny\n",
		"event: error\ndata: e\n\n":    "e",
		": c\ndata: 1\n: c\ndata: 2\n": "1\n2",
		"data:\n\n":                    "",
		"data: [DONE]":                 "[DONE]",
	} {
		if got := sse.Data([]byte(ev)); string(got) != want || got == nil {
			t.Errorf("Data(%q) = %q, want %q", ev, got, want)
		}
	}
	for _, ev := range []string{": keepalive\n\n", "event: ping\n\n", "\n", "datum: 1\n\n"} {
		if got := sse.Data([]byte(ev)); got != nil {
			t.Errorf("Data(%q) = %q, want none", ev, got)
		}
	}
}

// The push side and the pull side read the same lines from the same bytes.
func TestLinesAgreeWithReader(t *testing.T) {
	stream := ": hi\r\nevent: x\rdata:1\r\ndata: 2\n\nid\ndata\n\n"
	var pushed []sse.Line
	for l := range sse.Lines([]byte(stream)) {
		pushed = append(pushed, sse.Line{Field: l.Field, Value: slices.Clone(l.Value)})
	}
	r := sse.NewReader(strings.NewReader(stream), 64)
	for i, p := range pushed {
		l, err := r.Next()
		if err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
		if l.Field != p.Field || string(l.Value) != string(p.Value) {
			t.Errorf("line %d: Reader %q %q, Lines %q %q", i, l.Field, l.Value, p.Field, p.Value)
		}
	}
	if len(pushed) != 5 {
		t.Errorf("%d lines, want 5", len(pushed))
	}
	if l, err := r.Next(); err == nil {
		t.Errorf("Reader has one more line: %+v", l)
	}
}

// BenchmarkEvents is the cost per engine chunk of cutting a stream into
// events and reading each one's data.
func BenchmarkEvents(b *testing.B) {
	ev := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"llama-3-8b-instruct","choices":[{"index":0,"delta":{"content":"word "},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	var s sse.Events
	n := 0
	b.SetBytes(int64(len(ev)))
	b.ReportAllocs()
	for b.Loop() {
		_ = s.Write(ev, func(e []byte) error { n += len(sse.Data(e)); return nil })
	}
}

// FuzzEvents: however a stream is cut into writes, the same events come
// out, and they and the pending rest are exactly the bytes written.
func FuzzEvents(f *testing.F) {
	f.Add("data: 1\n\nevent: x\r\ndata: 2\r\n\r\ndata: 3\r\r: c\n\ndata: 4", 7)
	f.Add("\r\n\r\r\n\n\r", 1)
	f.Fuzz(func(t *testing.T, stream string, cut int) {
		if cut < 0 || cut > len(stream) {
			return
		}
		var whole, parts sse.Events
		want := split(t, &whole, stream)
		got := split(t, &parts, stream[:cut], stream[cut:])
		if !slices.Equal(got, want) || string(parts.Pending()) != string(whole.Pending()) {
			t.Fatalf("cut at %d: %q + %q, whole %q + %q", cut, got, parts.Pending(), want, whole.Pending())
		}
		if strings.Join(want, "")+string(whole.Pending()) != stream {
			t.Fatalf("events %q + %q are not the stream %q", want, whole.Pending(), stream)
		}
		for _, ev := range want {
			if !strings.HasSuffix(ev, "\n") && !strings.HasSuffix(ev, "\r") {
				t.Fatalf("event %q does not end with a line end", ev)
			}
		}
	})
}

// End hands on what a stream ended with as a whole last event, its end
// completed to a blank line, and nothing when nothing is held.
func TestEndCompletesTheLastEvent(t *testing.T) {
	for in, want := range map[string]string{
		"data: x":       "data: x\n\n",
		"data: x\n":     "data: x\n\n",
		"data: x\r":     "data: x\r\r",
		"data: x\r\n":   "data: x\r\n\n",
		"data: x\r\r":   "data: x\r\r", // whole; only its LF was awaited
		"data: x\r\n\r": "data: x\r\n\r",
		"":              "",
	} {
		var s sse.Events
		var got []string
		emit := func(ev []byte) error { got = append(got, string(ev)); return nil }
		if err := s.Write([]byte(in), emit); err != nil || len(got) != 0 {
			t.Fatalf("%q: %v, %q emitted before the end", in, err, got)
		}
		if err := s.End(emit); err != nil {
			t.Fatal(err)
		}
		if want == "" {
			if len(got) != 0 {
				t.Errorf("%q: End emitted %q", in, got)
			}
			continue
		}
		if len(got) != 1 || got[0] != want {
			t.Errorf("%q: End emitted %q, want %q", in, got, want)
		}
		// What End hands on is one whole event to a reader too (one that
		// may also wait for the end of the stream to know a CR is last).
		var again sse.Events
		n := 0
		count := func([]byte) error { n++; return nil }
		_ = again.Write([]byte(want), count)
		_ = again.End(count)
		if n != 1 || string(sse.Data([]byte(want))) != "x" {
			t.Errorf("%q: not one whole event with data x (%d events)", want, n)
		}
		if len(s.Pending()) != 0 {
			t.Errorf("%q: still held after End", in)
		}
	}
}

func TestEndAfterAnOversizedEventIsNothing(t *testing.T) {
	s := sse.Events{Max: 16, SkipOversized: true}
	if err := s.Write([]byte("data: "+strings.Repeat("x", 40)), func([]byte) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := s.End(func(ev []byte) error { t.Errorf("emitted %q", ev); return nil }); err != nil {
		t.Fatal(err)
	}
}
