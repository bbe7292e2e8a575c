package gateway_test

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/sse"
	"github.com/switchyard-llm/switchyard/subjects"
)

// chunk is an engine's streamed chat chunk.
func chunk(id string, created int, content string) string {
	c, _ := json.Marshal(content)
	return `data: {"id":"` + id + `","object":"chat.completion.chunk","created":` + strings.Repeat("1", created) +
		`,"model":"m","choices":[{"index":0,"delta":{"content":` + string(c) + `},"finish_reason":null}]}` + "\n\n"
}

// TestResumeSeam drives the seam of a resumed stream against a scripted
// upstream: the first replica sends a role chunk, two words and half an
// event, then fails (engine death, or a handover while draining); the
// continuation is asked of another replica with the text so far, and the
// client reads one stream: one id, one role chunk, no half event, the
// usage summed.
func TestResumeSeam(t *testing.T) {
	for _, how := range []string{"engine", "handover"} {
		t.Run(how, func(t *testing.T) {
			var mu sync.Mutex
			var cont *nats.Msg
			u := newUpstream(t, gateway.Config{}, func(r *reply, attempt int) {
				switch attempt {
				case 1:
					r.accept("r-0")
					r.head(200, "text/event-stream")
					r.send(nil, `data: {"id":"A","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}`+"\n\n")
					r.send(nil, chunk("A", 1, "one ")+chunk("A", 1, "two "))
					r.send(nil, `data: {"id":"A","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"thr`)
					if how == "handover" {
						r.send(nats.Header{subjects.HdrEOS: {"1"}, subjects.HdrHandover: {"1"}, subjects.HdrError: {"drained"}}, "")
					} else {
						r.end("engine stream broke: connection reset")
					}
				case 2:
					mu.Lock()
					cont = r.m
					mu.Unlock()
					r.accept("r-1")
					r.head(200, "text/event-stream")
					r.send(nil, `data: {"id":"B","object":"chat.completion.chunk","created":2,"model":"m","choices":[{"index":0,"delta":{"role":"assistant"},"finish_reason":null}]}`+"\n\n")
					r.send(nil, chunk("B", 2, "three ")+chunk("B", 2, "four "))
					r.send(nil, `data: {"id":"B","object":"chat.completion.chunk","created":2,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`+"\n\n")
					r.send(nil, `data: {"id":"B","object":"chat.completion.chunk","created":2,"model":"m","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":2,"total_tokens":14}}`+"\n\n")
					r.send(nil, "data: [DONE]\n\n")
					r.end("")
				}
			})
			s := u.postBody(`{"model":"chat-small","max_tokens":4,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"count"}]}`)
			if s.status != 200 || !strings.HasSuffix(s.body, "data: [DONE]\n\n") || !wholeEvents(s.body) {
				t.Fatalf("resumed stream: %d %q; want one whole stream, no half event", s.status, s.body)
			}
			var text strings.Builder
			ids, roles := map[string]bool{}, 0
			var usage map[string]int
			for ev := range strings.SplitSeq(strings.TrimSuffix(s.body, "\n\n"), "\n\n") {
				data := strings.TrimPrefix(ev, "data: ")
				if data == "[DONE]" {
					continue
				}
				var c struct {
					ID      string `json:"id"`
					Created int    `json:"created"`
					Choices []struct {
						Delta struct{ Role, Content string } `json:"delta"`
					} `json:"choices"`
					Usage map[string]int `json:"usage"`
				}
				if err := json.Unmarshal([]byte(data), &c); err != nil {
					t.Fatalf("event %q: %v", ev, err)
				}
				ids[c.ID+"/"+string(rune('0'+c.Created))] = true
				for _, ch := range c.Choices {
					text.WriteString(ch.Delta.Content)
					if ch.Delta.Role != "" {
						roles++
					}
				}
				if c.Usage != nil {
					usage = c.Usage
				}
			}
			if text.String() != "one two three four " || len(ids) != 1 || !ids["A/1"] || roles != 1 {
				t.Errorf("text %q, ids %v, %d role chunks; want the four words under id A created 1, one role chunk", text.String(), ids, roles)
			}
			if usage["prompt_tokens"] != 10 || usage["completion_tokens"] != 4 || usage["total_tokens"] != 14 {
				t.Errorf("usage %v; want the prompt once (12 less the 2 carried) and 4 completion tokens", usage)
			}
			mu.Lock()
			defer mu.Unlock()
			var body struct {
				MaxTokens            int  `json:"max_tokens"`
				ContinueFinalMessage bool `json:"continue_final_message"`
				AddGenerationPrompt  bool `json:"add_generation_prompt"`
				Messages             []struct{ Role, Content string }
			}
			if err := json.Unmarshal(cont.Data, &body); err != nil {
				t.Fatal(err)
			}
			last := body.Messages[len(body.Messages)-1]
			if !body.ContinueFinalMessage || body.AddGenerationPrompt || body.MaxTokens != 2 || len(body.Messages) != 2 ||
				last.Role != "assistant" || last.Content != "one two " {
				t.Errorf("continuation body %s", cont.Data)
			}
			if cont.Header.Get(subjects.HdrResume) != "r-0" || !strings.Contains(cont.Header.Get(subjects.HdrExclude), "r-0") ||
				cont.Header.Get(subjects.HdrMaxTokens) != "2" || cont.Header.Get(subjects.HdrResumeTokens) != "2" {
				t.Errorf("continuation headers %v", cont.Header)
			}
			cause := map[string]string{"engine": "engine", "handover": "handover"}[how]
			if n := u.counter("switchyard_gateway_resumes_total", map[string]string{"cause": cause, "outcome": "completed"}); n != 1 {
				t.Errorf("resumes counted %v, want 1", n)
			}
		})
	}
}

// TestResumeOnce: a continuation that fails too ends the stream with the
// explicit error; the client never sees half an event.
func TestResumeOnce(t *testing.T) {
	u := newUpstream(t, gateway.Config{IdleTimeout: 300 * time.Millisecond}, func(r *reply, attempt int) {
		r.accept("r-" + string(rune('0'+attempt)))
		r.head(200, "text/event-stream")
		r.send(nil, chunk("A", 1, "word ")+`data: {"id":"A","cho`)
		r.end("engine stream broke")
	})
	s := u.postBody(`{"model":"chat-small","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if n := u.attempts.Load(); n != 2 {
		t.Errorf("%d attempts, want the answer and one continuation", n)
	}
	if sseError(s.body) != subjects.CodeUpstreamError || !wholeEvents(s.body) || strings.Contains(s.body, "[DONE]") {
		t.Errorf("stream failing twice: %q; want whole events, then the explicit error", s.body)
	}
	if n := u.counter("switchyard_gateway_resumes_total", map[string]string{"cause": "engine", "outcome": "failed"}); n != 1 {
		t.Errorf("failed resumes counted %v, want 1", n)
	}
}

// wholeEvents reports whether every event of an SSE body is whole: its
// data JSON (or [DONE]), its end a blank line.
func wholeEvents(body string) bool {
	var events sse.Events
	whole := true
	err := events.Write([]byte(body), func(ev []byte) error {
		if data := sse.Data(ev); data != nil && string(data) != "[DONE]" && !json.Valid(data) {
			whole = false
		}
		return nil
	})
	return err == nil && whole && len(events.Pending()) == 0
}

// TestOversizedEventIsTheReplicasFault: an event that outgrows the
// relay's bound (sse.MaxEvent), sent in pieces as a runaway engine would,
// is never passed on; it counts as the replica failing mid-answer, and the
// answer continues elsewhere.
func TestOversizedEventIsTheReplicasFault(t *testing.T) {
	piece := strings.Repeat("x", sse.MaxEvent/2)
	u := newUpstream(t, gateway.Config{}, func(r *reply, attempt int) {
		r.accept("r-" + string(rune('0'+attempt)))
		r.head(200, "text/event-stream")
		if attempt == 1 {
			r.send(nil, chunk("A", 1, "one "))
			r.send(nil, `data: {"id":"A","choices":[{"index":0,"delta":{"content":"`+piece)
			r.send(nil, piece)
			r.send(nil, piece+`"},"finish_reason":null}]}`+"\n\n")
			r.end("")
			return
		}
		r.send(nil, chunk("B", 2, "two "))
		r.send(nil, "data: [DONE]\n\n")
		r.end("")
	})
	s := u.postBody(`{"model":"chat-small","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if s.status != 200 || strings.Contains(s.body, "xxxx") || !wholeEvents(s.body) || !strings.HasSuffix(s.body, "data: [DONE]\n\n") {
		t.Fatalf("stream with an oversized event: %d, %d bytes, ends %q", s.status, len(s.body), s.body[max(len(s.body)-200, 0):])
	}
	if n := u.attempts.Load(); n != 2 {
		t.Errorf("%d attempts, want the answer and one continuation", n)
	}
}

// TestResumeWithNoOtherReplica: a continuation the broker cannot route
// (no other replica) ends the stream the client has with the explicit
// error it would have had without one, never a second HTTP head or a
// rejection body inside the stream.
func TestResumeWithNoOtherReplica(t *testing.T) {
	u := newUpstream(t, gateway.Config{}, func(r *reply, attempt int) {
		if attempt > 1 {
			r.send(nats.Header{subjects.HdrStatus: {"503"}, subjects.HdrEOS: {"1"}, subjects.HdrContent: {"application/json"}},
				`{"error":{"message":"no replica of chat-small is available","type":"server_error","param":null,"code":"no_replicas"}}`)
			return
		}
		r.accept("r-0")
		r.head(200, "text/event-stream")
		r.send(nil, chunk("A", 1, "word "))
		r.end("engine stream broke")
	})
	s := u.postBody(`{"model":"chat-small","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if s.status != 200 || sseError(s.body) != subjects.CodeUpstreamError || !wholeEvents(s.body) ||
		!strings.Contains(s.body, "engine stream broke") || strings.Contains(s.body, "[DONE]") {
		t.Errorf("continuation with no replica: %d %q; want the first chunk, then the engine's failure as one SSE error event", s.status, s.body)
	}
	if n := u.attempts.Load(); n != 2 {
		t.Errorf("%d attempts; a continuation no broker can place is not retried", n)
	}
	if n := u.counter("switchyard_gateway_resumes_total", map[string]string{"cause": "engine", "outcome": "failed"}); n != 1 {
		t.Errorf("failed resumes counted %v, want 1", n)
	}
}
