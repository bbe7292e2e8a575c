package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/internal/sse"
	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// chatBody is a chat request for model with max_tokens n.
func chatBody(model string, n int, stream bool) string {
	return `{"model":"` + model + `","max_tokens":` + strconv.Itoa(n) + `,"stream":` + strconv.FormatBool(stream) +
		`,"messages":[{"role":"user","content":"tell me a story"}]}`
}

// outcome is what a client saw of one request, classified: a complete
// answer, an explicit error, or (never acceptable) a silent truncation.
type outcome struct {
	status  int
	replica string
	code    string // error code of a non-200 answer or of an SSE error event
	msg     string // its message
	done    bool   // a complete answer: [DONE] for a stream, a parsed body otherwise
	err     error  // transport error (connection refused, reset, timeout)
	took    time.Duration
	// elsewhere: the gateway sent the request nowhere and says another
	// may take it (gateway.HdrRetryElsewhere).
	elsewhere bool
}

// explicit reports whether the client was told clearly how the request
// ended: a complete answer, or an error it can see.
func (o outcome) explicit() bool {
	return o.err == nil && (o.done || o.code != "")
}

func (o outcome) String() string {
	return fmt.Sprintf("status %d replica %q code %q (%s) done %v err %v after %v", o.status, o.replica, o.code, o.msg, o.done, o.err, o.took.Round(time.Millisecond))
}

// send posts body and reads the whole answer.
func send(ctx context.Context, url, body string) outcome {
	start := time.Now()
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return outcome{err: err, took: time.Since(start)}
	}
	defer resp.Body.Close()
	o := readAnswer(resp)
	o.took = time.Since(start)
	return o
}

// readAnswer classifies a response.
func readAnswer(resp *http.Response) outcome {
	o := outcome{status: resp.StatusCode, replica: resp.Header.Get("X-Switchyard-Replica")}
	if sse.IsEventStream(resp.Header.Get("Content-Type")) {
		o.done, o.code, o.msg, o.err = readSSEMessage(resp.Body)
		return o
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		o.err = err
		return o
	}
	if resp.StatusCode != 200 {
		var e struct {
			Error struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(b, &e) == nil {
			o.code, o.msg = e.Error.Code, e.Error.Message
		}
		return o
	}
	var c struct {
		Choices []json.RawMessage `json:"choices"`
	}
	o.done = json.Unmarshal(b, &c) == nil && len(c.Choices) > 0
	return o
}

// readSSE reads a stream to its end: done when it ended with [DONE], the
// code of its error line (data: {"error":…}) when it ended with one.
func readSSE(r io.Reader) (done bool, code string, err error) {
	done, code, _, err = readSSEMessage(r)
	return done, code, err
}

// readSSEMessage is readSSE with the error line's message.
func readSSEMessage(r io.Reader) (done bool, code, msg string, err error) {
	sr := sse.NewReader(r, 1<<20)
	eventLine := false
	for {
		l, err := sr.Next()
		if errors.Is(err, io.EOF) {
			return done, code, msg, nil
		}
		if err != nil {
			return done, code, msg, err
		}
		switch {
		case l.Field == "event" && string(l.Value) == "error":
			eventLine = true // a form go-openai cannot parse: never sent
		case l.Done():
			done = true
		case l.Field == "data" && bytes.HasPrefix(l.Value, []byte(`{"error"`)) && !eventLine:
			var e struct {
				Error struct {
					Code    string `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if json.Unmarshal(l.Value, &e) == nil {
				code, msg = e.Error.Code, e.Error.Message
			}
			if code == "" {
				code = "unparsed"
			}
		}
	}
}

// openStream starts a streamed chat and returns once its head arrived.
func openStream(ctx context.Context, t *testing.T, url, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("stream: status %d: %s", resp.StatusCode, b)
	}
	return resp
}

// streamOn starts streams of body until one is served by replica and
// returns it (the others are cancelled). cancel ends the returned stream.
func streamOn(t *testing.T, url, replica, body string) (resp *http.Response, cancel context.CancelFunc) {
	t.Helper()
	for range 50 {
		ctx, cancel := context.WithCancel(context.Background())
		resp := openStream(ctx, t, url, body)
		if resp.Header.Get("X-Switchyard-Replica") == replica {
			return resp, cancel
		}
		cancel()
		resp.Body.Close()
	}
	t.Fatalf("no stream landed on %s in 50 tries", replica)
	return nil, nil
}

// spread sends n short requests one after the other and counts them per
// serving replica; any other outcome fails the test.
func spread(t *testing.T, url, model string, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for range n {
		o := send(context.Background(), url, chatBody(model, 1, false))
		if o.status != 200 || !o.done {
			t.Fatalf("request failed: %v", o)
		}
		got[o.replica]++
	}
	return got
}

// metric sums the samples of a counter or gauge in the stack's registry
// whose labels include want.
func metric(st *devstack.Stack, name string, want map[string]string) float64 {
	return testkit.Sum(st.Registry(), name, want)
}

// startUnready starts a stack without waiting for every replica to be
// ready (some are kept loading on purpose); it waits for the gateway's
// table and a broker.
func startUnready(t *testing.T, cfg devstack.Config) *devstack.Stack {
	t.Helper()
	st := launch(t, cfg)
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if st.Gateway().Table() == nil || st.Broker(0).Table() == nil {
			return errors.New("table not loaded")
		}
		return nil
	})

	return st
}

// replicaState is the broker's registered state of a replica ("" when not
// registered).
func replicaState(st *devstack.Stack, id string) string {
	t := st.Broker(0).Table()
	if t == nil || t.Replicas[id] == nil {
		return ""
	}
	return t.Replicas[id].State
}

func jsonMarshal(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}
