package gateway

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// TestSSEEventsHandsOnOnlyWholeEvents feeds a stream cut at every byte:
// the events come out whole and in order, whatever the cut, and what is
// left held is the incomplete last event.
func TestSSEEventsHandsOnOnlyWholeEvents(t *testing.T) {
	stream := "data: {\"a\":1}\n\n: comment\n\nevent: x\ndata: 2\r\n\r\ndata: 3\r\rdata: {\"partial\""
	want := []string{"data: {\"a\":1}\n\n", ": comment\n\n", "event: x\ndata: 2\r\n\r\n", "data: 3\r\r"}
	for cut := 1; cut < len(stream); cut++ {
		var s sseEvents
		var got []string
		emit := func(ev []byte) error { got = append(got, string(ev)); return nil }
		for _, part := range []string{stream[:cut], stream[cut:]} {
			if err := s.write([]byte(part), emit); err != nil {
				t.Fatal(err)
			}
		}
		if strings.Join(got, "|") != strings.Join(want, "|") {
			t.Fatalf("cut at %d: %q, want %q", cut, got, want)
		}
		if s.pending() != len(`data: {"partial"`) {
			t.Fatalf("cut at %d: %d bytes held, want the partial event", cut, s.pending())
		}
	}
}

func TestSSEEventsBoundsAnEvent(t *testing.T) {
	var s sseEvents
	err := s.write([]byte("data: "+strings.Repeat("x", maxSSEEvent)), func([]byte) error { return nil })
	if !errors.Is(err, errSSEEventTooLarge) || s.pending() != 0 {
		t.Fatalf("oversized event: %v, %d held", err, s.pending())
	}
}

func TestSSEData(t *testing.T) {
	for ev, want := range map[string]string{
		"data: {}\n\n":              "{}",
		"data:x\ndata: y\n\n":       "x\ny",
		": keepalive\n\n":           "",
		"event: error\ndata: e\n\n": "e",
	} {
		if got := string(sseData([]byte(ev))); got != want {
			t.Errorf("sseData(%q) = %q, want %q", ev, got, want)
		}
	}
}

// BenchmarkRelayEvents is what following a resumable stream costs the
// relay per chunk: cutting the bytes into events and reading each one.
func BenchmarkRelayEvents(b *testing.B) {
	ev := []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"llama-3-8b-instruct","choices":[{"index":0,"delta":{"content":"word "},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	for _, follow := range []bool{false, true} {
		name := "split"
		if follow {
			name = "split+follow"
		}
		b.Run(name, func(b *testing.B) {
			var s sseEvents
			c := &carry{on: follow}
			b.SetBytes(int64(len(ev)))
			b.ReportAllocs()
			for b.Loop() {
				_ = s.write(ev, func(e []byte) error { _, _ = c.event(e); return nil })
				if len(c.text) > 1<<16 {
					c.text = c.text[:0]
				}
			}
		})
	}
}

// TestPlainDeltaAgreesWithDecoding: the fast read of a chunk either gives
// up or gives the text a full decode gives.
func TestPlainDeltaAgreesWithDecoding(t *testing.T) {
	chunks := []string{
		`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"word "},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"c","choices":[{"index":0,"delta":{"content":"quote \" and \\ and \u00e9 \ud83d\ude00"},"finish_reason":null}]}`,
		`{"id":"c","choices":[{"index":0,"delta":{"content":"a \"content\":\"fake\" inside"},"finish_reason":null}]}`,
		`{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`,
		`{"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`,
		`{"id":"c","choices":[{"index":0,"delta":{"content":"x"},"logprobs":{"content":[]},"finish_reason":null}]}`,
		`{"id":"c","choices":[{"index":1,"delta":{"content":"x"},"finish_reason":null}]}`,
		`{"id":"c","choices":[{"index":0,"delta":{"content":"x"}},{"index":0,"delta":{"content":"y"}}]}`,
		`{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]},"finish_reason":null}]}`,
		`{"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}`,
		`{"id":"cmpl","object":"text_completion","choices":[{"index":0,"text":"tok ","logprobs":null,"finish_reason":null}]}`,
		`{"id":"c","choices":[{"index":0,"delta":{"content":null},"finish_reason":null}]}`,
		`{"id":"c","choices":[{"index":0,"delta":{"content":"cut`,
	}
	for _, ch := range chunks {
		fast, ok := plainDelta([]byte(ch))
		if !ok {
			continue
		}
		var c carry
		c.on, c.known = true, true
		c.parts = 0
		var v chunkView
		if err := json.Unmarshal([]byte(ch), &v); err != nil {
			t.Errorf("%s: read fast as %q, but it is not JSON", ch, fast)
			continue
		}
		want := ""
		for _, choice := range v.Choices {
			if choice.Text != nil {
				want += *choice.Text
			}
			if choice.Delta != nil && choice.Delta.Content != nil {
				want += *choice.Delta.Content
			}
			if choice.FinishReason != nil || choice.Index != 0 || (choice.Delta != nil && choice.Delta.Role != "") {
				t.Errorf("%s: read fast, but it needs decoding", ch)
			}
		}
		if fast != want {
			t.Errorf("%s: fast %q, decoded %q", ch, fast, want)
		}
	}
}
