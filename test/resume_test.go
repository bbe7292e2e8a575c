package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/sse"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// reading is what a client read of one chat reading, streamed or not.
type reading struct {
	status    int
	replica   string
	ids       map[string]bool
	created   map[int64]bool
	models    map[string]bool
	text      strings.Builder
	chunks    int // content chunks
	roles     int // role chunks
	prompt    int // usage
	completed int
	done      bool   // [DONE], or a whole JSON body
	errCode   string // an SSE error event's, or an error body's
}

func newReading() *reading {
	return &reading{ids: map[string]bool{}, created: map[int64]bool{}, models: map[string]bool{}}
}

// chunk reads one chunk, or a whole non-streamed body.
func (a *reading) chunk(b []byte) {
	var c struct {
		ID      string `json:"id"`
		Created int64  `json:"created"`
		Model   string `json:"model"`
		Choices []struct {
			Delta struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"delta"`
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
		Usage *struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
		Error *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		a.errCode = "unparsable: " + string(b)
		return
	}
	if c.Error != nil {
		a.errCode = c.Error.Code + " (" + c.Error.Message + ")"
		if c.Error.Code == "" {
			a.errCode = "error (" + c.Error.Message + ")"
		}
		return
	}
	a.ids[c.ID], a.created[c.Created], a.models[c.Model] = true, true, true
	for _, ch := range c.Choices {
		if ch.Delta.Role != "" {
			a.roles++
		}
		if s := ch.Delta.Content + ch.Message.Content; s != "" {
			a.chunks++
			a.text.WriteString(s)
		}
	}
	if c.Usage != nil {
		a.prompt, a.completed = c.Usage.PromptTokens, c.Usage.CompletionTokens
	}
}

// readStream reads an SSE reading; after, if set, runs once after n content
// chunks.
func readStream(r io.Reader, a *reading, n int, after func()) error {
	sr := sse.NewReader(r, 1<<20)
	for {
		l, err := sr.Next()
		switch {
		case errors.Is(err, io.EOF):
			return nil
		case err != nil:
			return err
		case l.Field != "data":
		case l.Done():
			a.done = true
		default:
			a.chunk(l.Value)
			if after != nil && a.chunks == n {
				after()
				after = nil
			}
		}
	}
}

// askChat sends a chat request and reads the reading; for a stream, after runs
// after n content chunks.
func askChat(t *testing.T, url, body string, n int, after func()) *reading {
	t.Helper()
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	a := newReading()
	a.status, a.replica = resp.StatusCode, resp.Header.Get("X-Switchyard-Replica")
	if sse.IsEventStream(resp.Header.Get("Content-Type")) {
		if err := readStream(resp.Body, a, n, after); err != nil {
			t.Fatal(err)
		}
		return a
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	a.chunk(b)
	a.done = resp.StatusCode == 200 && a.errCode == ""
	return a
}

func resumeBody(stream bool, extra string) string {
	return `{"model":"chat-small","max_tokens":500,"stream":` + fmt.Sprint(stream) + extra +
		`,"stream_options":null,"messages":[{"role":"user","content":"tell me a long story"}]}`
}

// whole checks that got is the uninterrupted reading want, told as one.
func whole(t *testing.T, what string, got, want *reading) {
	t.Helper()
	switch {
	case !got.done || got.errCode != "":
		t.Fatalf("%s: not a whole reading (status %d, error %q)", what, got.status, got.errCode)
	case got.text.String() != want.text.String():
		t.Fatalf("%s: text differs from the uninterrupted reading:\n%q\nwant\n%q", what, got.text.String(), want.text.String())
	case len(got.ids) != 1 || len(got.created) != 1 || len(got.models) != 1:
		t.Fatalf("%s: ids %v, created %v, models %v; want one of each", what, got.ids, got.created, got.models)
	case got.roles > 1:
		t.Fatalf("%s: %d role chunks", what, got.roles)
	case got.completed != 500 || got.prompt != want.prompt:
		t.Fatalf("%s: usage prompt %d completion %d; want prompt %d (once) and completion 500", what, got.prompt, got.completed, want.prompt)
	}
}

// TestEngineDeathMidAnswerResumesElsewhere kills the engine under a
// 500-token reading after 100 tokens: the client gets one whole reading from
// the other replica (one stream, one id, the text of the uninterrupted
// reading, the usage summed), streamed or not; with logprobs the stream cannot
// be continued and ends with its explicit error.
func TestEngineDeathMidAnswerResumesElsewhere(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: l8(), Speed: 1, DeterministicText: true})
	url := st.GatewayURL()
	usage := `,"stream_options":{"include_usage":true}`
	streamBody := strings.Replace(resumeBody(true, ""), `,"stream_options":null`, usage, 1)
	want := askChat(t, url, streamBody, 0, nil)
	if !want.done || want.completed != 500 {
		t.Fatalf("uninterrupted reading: done %v, %d tokens", want.done, want.completed)
	}
	kill := func(a **reading) func() {
		return func() {
			for _, id := range []string{"l8-gen-0", "l8-gen-1"} {
				if st.Engine(id).InFlight() > 0 {
					st.Faults(id).Kill()
					t.Cleanup(func() { _ = st.Faults(id).Restart() })
					return
				}
			}
			t.Error("no engine works on the reading")
		}
	}
	restart := func() {
		for _, id := range []string{"l8-gen-0", "l8-gen-1"} {
			_ = st.Faults(id).Restart()
		}
		testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
			if s0, s1 := replicaState(st, "l8-gen-0"), replicaState(st, "l8-gen-1"); s0 != subjects.StateReady || s1 != subjects.StateReady {
				return fmt.Errorf("replicas %s, %s", s0, s1)
			}
			return nil
		})
	}

	t.Run("stream", func(t *testing.T) {
		var got *reading
		got = askChat(t, url, streamBody, 100, kill(&got))
		whole(t, "stream", got, want)
		if n := metric(st, "switchyard_gateway_resumes_total", map[string]string{"outcome": "completed"}); n != 1 {
			t.Errorf("resumes completed: %v, want 1", n)
		}
	})
	restart()
	t.Run("non-streamed", func(t *testing.T) {
		generated := func() float64 {
			return testkit.Sum(st.Engine("l8-gen-0").Registry(), "vllm:generation_tokens_total", nil) +
				testkit.Sum(st.Engine("l8-gen-1").Registry(), "vllm:generation_tokens_total", nil)
		}
		before := generated()
		done := make(chan *reading, 1)
		go func() { done <- askChat(t, url, resumeBody(false, ""), 0, nil) }()
		testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
			if st.Engine("l8-gen-0").InFlight()+st.Engine("l8-gen-1").InFlight() != 1 {
				return fmt.Errorf("not in an engine yet")
			}
			return nil
		})
		testkit.CheckFor(t, 30*time.Second, 10*time.Millisecond, testkit.Cond("100 of the 500 tokens", func() bool { return generated()-before >= 100 }))
		kill(nil)()
		got := <-done
		whole(t, "non-streamed", got, want)
	})
	restart()
	t.Run("logprobs", func(t *testing.T) {
		var got *reading
		got = askChat(t, url, strings.Replace(streamBody, `"stream":true`, `"stream":true,"logprobs":true`, 1), 100, kill(&got))
		if got.done || !strings.HasPrefix(got.errCode, subjects.CodeUpstreamError) {
			t.Fatalf("logprobs: done %v, error %q; want the explicit upstream_error", got.done, got.errCode)
		}
	})
}

// TestAdapterCrashMidAnswerResumesElsewhere: an adapter that dies as on
// SIGKILL (its NATS connection gone with it, its reply never ended) leaves
// the stream silent; the gateway's probe of the silent reply finds nothing
// on the replica's subjects, and the answer continues on the other replica,
// whole. The idle timeout (a minute) would continue it too, later: the
// failure's cause tells the two apart.
func TestAdapterCrashMidAnswerResumesElsewhere(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: l8(), Speed: 1, DeterministicText: true,
		Gateway: gateway.Config{ProbeAfter: 200 * time.Millisecond}})
	url := st.GatewayURL()
	body := strings.Replace(resumeBody(true, ""), `,"stream_options":null`, `,"stream_options":{"include_usage":true}`, 1)
	want := askChat(t, url, body, 0, nil)
	if !want.done || want.completed != 500 {
		t.Fatalf("uninterrupted reading: done %v, %d tokens", want.done, want.completed)
	}
	got := askChat(t, url, body, 100, func() {
		for _, id := range []string{"l8-gen-0", "l8-gen-1"} {
			if st.Engine(id).InFlight() > 0 {
				if err := st.CrashReplica(id); err != nil {
					t.Error(err)
				}
				return
			}
		}
		t.Error("no engine works on the reading")
	})
	whole(t, "stream", got, want)
	if n := metric(st, "switchyard_gateway_stream_errors_total", map[string]string{"cause": "replica_gone"}); n != 1 {
		t.Errorf("stream errors with cause replica_gone: %v, want 1 (found by the probe, not the idle timeout)", n)
	}
	if n := metric(st, "switchyard_gateway_resumes_total", map[string]string{"outcome": "completed"}); n != 1 {
		t.Errorf("resumes completed: %v, want 1", n)
	}
}

// TestDrainHandsStreamsOver stops an adapter (as on SIGTERM) with a 300 ms
// grace under ten 3-second streams: its unfinished answers are handed back
// and continued on the other replica, and all ten finish whole.
func TestDrainHandsStreamsOver(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: l8(), Speed: 1, DeterministicText: true, DrainGrace: 300 * time.Millisecond})
	url := st.GatewayURL()
	// 600 tokens at the engine's 5 ms a step: about 3 seconds.
	body := `{"model":"chat-small","max_tokens":600,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"tell me a long story"}]}`
	want := askChat(t, url, body, 0, nil)
	var wg sync.WaitGroup
	got := make([]*reading, 10)
	started := make(chan struct{}, 10)
	for i := range got {
		wg.Go(func() {
			got[i] = askChat(t, url, body, 1, func() { started <- struct{}{} })
		})
	}
	for range got {
		<-started
	}
	victim := "l8-gen-0"
	if st.Engine(victim).InFlight() == 0 {
		victim = "l8-gen-1"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := st.StopReplica(victim); err != nil {
		t.Fatal(err)
	}
	_ = ctx
	wg.Wait()
	for i, a := range got {
		if !a.done || a.errCode != "" || a.text.String() != want.text.String() || len(a.ids) != 1 || a.completed != want.completed {
			t.Errorf("stream %d: done %v error %q ids %d, %d tokens; want the whole reading", i, a.done, a.errCode, len(a.ids), a.completed)
		}
	}
	t.Logf("%s drained with a 300ms grace: %v resumes by handover", victim,
		metric(st, "switchyard_gateway_resumes_total", map[string]string{"cause": "handover", "outcome": "completed"}))
}
