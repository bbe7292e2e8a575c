package batch_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/batch"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

func line(id, url, body string) string {
	return `{"custom_id":"` + id + `","method":"POST","url":"` + url + `","body":` + body + "}\n"
}

const chat = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`

func TestCheckerRefusesTheFirstBadLine(t *testing.T) {
	good := line("a", "/v1/chat/completions", chat)
	for _, c := range []struct {
		name, in string
		status   int
		want     string
	}{
		{"empty", "", 400, "empty"},
		{"blank lines", "\n\n  \n", 400, "empty"},
		{"not JSON", good + "nope\n", 400, "line 2: not a JSON object"},
		{"an array", "[1]\n", 400, "line 1: not a JSON object"},
		{"no custom_id", line("", "/v1/chat/completions", chat), 400, "line 1: custom_id is required"},
		{"a long custom_id", line(strings.Repeat("x", 65), "/v1/chat/completions", chat), 400, "line 1: custom_id must be at most 64"},
		{"GET", strings.Replace(good, "POST", "GET", 1), 400, `line 1: method must be "POST"`},
		{"an unknown url", line("a", "/v1/images/generations", chat), 400, "line 1: url must be one of"},
		{"/v1/messages", line("a", "/v1/messages", chat), 400, "line 1: url must be one of"},
		{"a body that is no object", line("a", "/v1/completions", `"x"`), 400, "line 1: body must be a JSON object"},
		{"no model", line("a", "/v1/completions", `{"prompt":"x"}`), 400, "line 1: body.model is required"},
		{"a stream", line("a", "/v1/chat/completions", `{"model":"m","stream":true}`), 400, "line 1: body.stream"},
		{"a duplicate", good + "\n" + good, 400, `line 3: custom_id "a" is already used on line 1`},
		{"too many lines", good + line("b", "/v1/chat/completions", chat) + line("c", "/v1/chat/completions", chat), 400, "line 3: the file is over the limit of 2 lines"},
		{"too many bytes", good + strings.Repeat(" ", 1024), 413, "over the limit of 1024 bytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			chk := batch.NewChecker(strings.NewReader(c.in), 1024, 2)
			_, err := io.Copy(io.Discard, chk)
			var e *subjects.APIError
			if !errors.As(err, &e) || e.Status != c.status || !strings.Contains(e.Message, c.want) {
				t.Fatalf("got %v, want %d %q", err, c.status, c.want)
			}
			if !errors.Is(chk.Err(), err) {
				t.Errorf("Err() = %v, the read ended with %v", chk.Err(), err)
			}
		})
	}
	chk := batch.NewChecker(strings.NewReader(good+"\n"+line("b", "/v1/embeddings", `{"model":"e","input":"x"}`)), 1024, 2)
	if _, err := io.Copy(io.Discard, chk); err != nil || chk.Lines() != 3 || chk.Requests() != 2 {
		t.Fatalf("a good file: %v, %d lines, %d requests", err, chk.Lines(), chk.Requests())
	}
}

// brokerStandIn answers llm.batch.* in the reply protocol: each line's
// first two tries get a 503 with a short Retry-After, the first a broker's
// refusal and the second an adapter's (naming its replica), then an
// answer; the model "forbidden" gets the 403 a broker gives.
type brokerStandIn struct {
	mu    sync.Mutex
	tries map[string]int
	seen  []nats.Header
}

func (b *brokerStandIn) serve(nc *nats.Conn) func(*nats.Msg) {
	return func(m *nats.Msg) {
		var body struct {
			Model    string `json:"model"`
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		_ = json.Unmarshal(m.Data, &body)
		key := body.Messages[0].Content
		b.mu.Lock()
		b.tries[key]++
		n := b.tries[key]
		b.seen = append(b.seen, m.Header)
		b.mu.Unlock()
		r := nats.NewMsg(m.Reply)
		r.Header.Set(subjects.HdrSeq, "0")
		r.Header.Set(subjects.HdrEOS, "1")
		switch {
		case body.Model == "forbidden":
			r.Header.Set(subjects.HdrStatus, "403")
			r.Data = subjects.NewError(403, subjects.CodeModelNotAllowed, "no").Body()
		case n <= 2:
			if n == 2 {
				r.Header.Set(subjects.HdrRouteReplica, "r-1")
			}
			r.Header.Set(subjects.HdrStatus, "503")
			r.Header.Set(subjects.HdrRetryAfterMS, "20")
			r.Data = subjects.NewError(503, subjects.CodeAllReplicasBusy, "busy").Body()
		default:
			// The accept rides on the head, as an engine's quick answer does.
			r.Header.Set(subjects.HdrSeq, "1")
			r.Header.Set(subjects.HdrAccepted, "r-1")
			r.Header.Set(subjects.HdrStatus, "200")
			r.Data = []byte(`{"object":"chat.completion","echo":` + fmt.Sprintf("%q", key) + `}`)
		}
		_ = nc.PublishMsg(r)
	}
}

func TestBatcherPacesOnRefusalsAndAnswersEachLineOnce(t *testing.T) {
	stand := &brokerStandIn{tries: map[string]int{}}
	g := newBatchRig(t, 60*time.Second, stand.serve)
	ctx, st := g.ctx, g.st
	rec := createBatch(ctx, t, st, chatLines(30)+line("nope", "/v1/chat/completions", `{"model":"forbidden","messages":[{"role":"user","content":"x"}]}`))
	if rec.RequestCounts.Total != 31 {
		t.Fatalf("%d requests in the batch, want 31", rec.RequestCounts.Total)
	}
	reg := prometheus.NewRegistry()
	g.run(t, batch.Config{ID: "b1", SuperviseEvery: 50 * time.Millisecond, AckWait: 2 * time.Second, Registerer: reg})

	var got *batch.Record
	testkit.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() (err error) {
		if got, err = st.Batch(ctx, "acme", rec.ID); err != nil {
			return err
		}
		if got.Status != batch.StatusCompleted {
			return fmt.Errorf("status %s %+v", got.Status, got.RequestCounts)
		}
		return nil
	})
	if got.RequestCounts != (batch.RequestCounts{Total: 31, Completed: 30, Failed: 1}) || got.OutputFileID == nil || got.ErrorFileID == nil {
		t.Fatalf("completed: %+v", got)
	}
	out := readLines(t, st, *got.OutputFileID)
	if len(out) != 30 {
		t.Errorf("%d output lines, want 30", len(out))
	}
	for i, l := range out {
		if l.Response == nil || l.Response.StatusCode != 200 || l.Error != nil || !strings.Contains(string(l.Response.Body), fmt.Sprintf(`"line %d"`, i+1)) {
			t.Errorf("output line %d: %+v", i+1, l)
		}
	}
	errs := readLines(t, st, *got.ErrorFileID)
	if len(errs) != 1 || errs[0].CustomID != "nope" || errs[0].Response.StatusCode != 403 {
		t.Errorf("error file: %+v", errs)
	}
	if paced := testkit.Sum(reg, "switchyard_batch_items_total", map[string]string{"outcome": "paced"}); paced < 60 {
		t.Errorf("%v lines paced, want the 60 refusals", paced)
	}
	for _, from := range []string{"broker", "adapter"} {
		labels := map[string]string{"status": "503", "code": subjects.CodeAllReplicasBusy, "from": from}
		if n := testkit.Sum(reg, "switchyard_batch_refusals_total", labels); n != 30 {
			t.Errorf("%v refusals counted %v, want 30", n, labels)
		}
	}
	stand.mu.Lock()
	defer stand.mu.Unlock()
	for _, h := range stand.seen {
		if h.Get(subjects.HdrEndpoint) != "/v1/chat/completions" || h.Get(subjects.HdrDeadline) == "" {
			t.Fatalf("a line was sent with %v", h)
		}
	}
}

func readLines(t *testing.T, st *batch.Store, id string) []batch.OutputLine {
	t.Helper()
	r, _, err := st.OpenFile(context.Background(), "acme", id)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var out []batch.OutputLine
	dec := json.NewDecoder(r)
	for {
		var l batch.OutputLine
		if err := dec.Decode(&l); err == io.EOF {
			return out
		} else if err != nil {
			t.Fatal(err)
		}
		out = append(out, l)
	}
}
