package batch_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/batch"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/subjects"
)

// heldBroker answers llm.batch.* in the reply protocol, but only when the
// test lets it: until then every line it was sent is in flight.
type heldBroker struct {
	mu       sync.Mutex
	held     []*nats.Msg
	sent     map[string]int // line content → times sent
	answered map[string]bool
}

func (h *heldBroker) take(m *nats.Msg) {
	var body struct {
		Messages []struct {
			Content string `json:"content"`
		} `json:"messages"`
	}
	_ = json.Unmarshal(m.Data, &body)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sent[body.Messages[0].Content]++
	h.held = append(h.held, m)
}

func (h *heldBroker) inFlight() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.held)
}

// answerHeld answers every line held so far with a 200 that echoes it.
func (h *heldBroker) answerHeld(nc *nats.Conn) {
	h.mu.Lock()
	held := h.held
	h.held = nil
	h.mu.Unlock()
	for _, m := range held {
		var body struct {
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		_ = json.Unmarshal(m.Data, &body)
		key := body.Messages[0].Content
		r := nats.NewMsg(m.Reply)
		r.Header.Set(subjects.HdrSeq, "0")
		r.Header.Set(subjects.HdrEOS, "1")
		r.Header.Set(subjects.HdrStatus, "200")
		r.Data = []byte(`{"object":"chat.completion","echo":` + fmt.Sprintf("%q", key) + `}`)
		if err := nc.PublishMsg(r); err == nil {
			h.mu.Lock()
			h.answered[key] = true
			h.mu.Unlock()
		}
	}
}

// A cancelled batch keeps what its lines in flight answer: each of them is
// in the output file once, and no line that was never answered is.
func TestCancelKeepsTheLinesInFlight(t *testing.T) {
	broker := &heldBroker{sent: map[string]int{}, answered: map[string]bool{}}
	g := newBatchRig(t, 60*time.Second, func(*nats.Conn) func(*nats.Msg) { return broker.take })
	ctx, nc, st := g.ctx, g.nc, g.st
	const lines = 200
	rec := createBatch(ctx, t, st, chatLines(lines))
	g.run(t, batch.Config{ID: "b1", SuperviseEvery: 50 * time.Millisecond, AckWait: 2 * time.Second})

	// The batcher starts with a window of 16 lines: all of them wait on
	// the broker when the batch is cancelled.
	testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, testkit.Cond("16 lines in flight", func() bool { return broker.inFlight() >= 16 }))
	if _, apiErr := st.Cancel(ctx, "acme", rec.ID); apiErr != nil {
		t.Fatal(apiErr)
	}
	// While they wait, the batch stays cancelling: it is not finalized
	// without them.
	if _, err := testkit.Poll(2*time.Second, 20*time.Millisecond, func() error {
		got, err := st.Batch(ctx, "acme", rec.ID)
		if err != nil || got.Status == batch.StatusCancelling {
			return fmt.Errorf("%v: still cancelling", err)
		}
		return nil
	}); err == nil {
		t.Fatalf("the batch left cancelling with %d lines in flight", broker.inFlight())
	}
	// Lines taken in the moment the cancel needs to reach the batcher are
	// in flight too: answer each as it comes.
	var got *batch.Record
	testkit.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() (err error) {
		broker.answerHeld(nc)
		if got, err = st.Batch(ctx, "acme", rec.ID); err != nil {
			return err
		}
		if got.Status != batch.StatusCancelled {
			return fmt.Errorf("status %s %+v", got.Status, got.RequestCounts)
		}
		return nil
	})

	broker.mu.Lock()
	defer broker.mu.Unlock()
	if len(broker.answered) >= lines {
		t.Fatalf("all %d lines ran: the cancel stopped none", len(broker.answered))
	}
	if got.OutputFileID == nil {
		t.Fatalf("cancelled with %d lines answered and no output file: %+v", len(broker.answered), got)
	}
	seen := map[string]bool{}
	for _, l := range readLines(t, st, *got.OutputFileID) {
		var body struct {
			Echo string `json:"echo"`
		}
		if l.Response == nil || json.Unmarshal(l.Response.Body, &body) != nil || !broker.answered[body.Echo] {
			t.Errorf("an output line the broker never answered: %+v", l)
			continue
		}
		if seen[body.Echo] {
			t.Errorf("%s is in the output twice", body.Echo)
		}
		seen[body.Echo] = true
	}
	for key := range broker.answered {
		if !seen[key] {
			t.Errorf("%s was answered while in flight and is not in the output", key)
		}
	}
	if got.RequestCounts.Completed != len(broker.answered) || got.RequestCounts.Failed != 0 || got.ErrorFileID != nil {
		t.Errorf("request counts %+v with %d lines answered", got.RequestCounts, len(broker.answered))
	}
	for key, n := range broker.sent {
		if n > 1 {
			t.Errorf("%s was sent %d times", key, n)
		}
	}
	t.Logf("cancelled with %d of %d lines in flight; all of them in the output", len(broker.answered), lines)
}

// batchRig is a batcher over a stand-in for the brokers: a NATS server, a
// connection whose llm.batch.* is answered by serve, and the batch store.
type batchRig struct {
	nc  *nats.Conn
	st  *batch.Store
	ctx context.Context
}

// newBatchRig starts the server, the stand-in and the store; everything
// stops when the test ends, or after timeout.
func newBatchRig(t *testing.T, timeout time.Duration, serve func(*nats.Conn) func(*nats.Msg)) *batchRig {
	t.Helper()
	_, url := natstest.Start(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if _, err := nc.Subscribe("llm.batch.*", serve(nc)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	js, _ := jetstream.New(nc)
	st, err := batch.OpenStore(ctx, js, 1)
	if err != nil {
		t.Fatal(err)
	}
	return &batchRig{nc: nc, st: st, ctx: ctx}
}

// run starts a batcher with cfg; it stops, and Run returns, before the
// connection closes.
func (g *batchRig) run(t *testing.T, cfg batch.Config) {
	t.Helper()
	b, err := batch.New(g.nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(g.ctx)
	done := make(chan error, 1)
	go func() { done <- b.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done })
}

// chatLines is n chat lines, custom ids c1…cn, each asking "line i".
func chatLines(n int) string {
	var in strings.Builder
	for i := 1; i <= n; i++ {
		in.WriteString(line(fmt.Sprint("c", i), "/v1/chat/completions", fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"line %d"}]}`, i)))
	}
	return in.String()
}

// createBatch stores in as acme's file and creates a batch over it, as the
// gateway does.
func createBatch(ctx context.Context, t *testing.T, st *batch.Store, in string) *batch.Record {
	t.Helper()
	return createBatchUntil(ctx, t, st, in, time.Now().Add(time.Hour))
}

// createBatchUntil is createBatch with the batch's window ending at exp.
func createBatchUntil(ctx context.Context, t *testing.T, st *batch.Store, in string, exp time.Time) *batch.Record {
	t.Helper()
	f, err := st.PutFile(ctx, "acme", "in.jsonl", batch.PurposeBatch, batch.NewChecker(strings.NewReader(in), 1<<20, 100_000))
	if err != nil {
		t.Fatal(err)
	}
	lines, requests, apiErr := st.CheckInput(ctx, "acme", f.ID, "/v1/chat/completions")
	if apiErr != nil {
		t.Fatalf("check input: %v", apiErr)
	}
	now := time.Now()
	expires := exp.Unix()
	rec := &batch.Record{Batch: batch.Batch{ID: batch.NewBatchID(now), Object: "batch", Endpoint: "/v1/chat/completions",
		InputFileID: f.ID, CompletionWindow: "24h", Status: batch.StatusValidating, CreatedAt: now.Unix(), ExpiresAt: &expires,
		RequestCounts: batch.RequestCounts{Total: requests}}, Tenant: "acme", Lines: lines}
	if err := st.CreateBatch(ctx, rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

// TestAStreamThatSaysNoItemIsLeftDoesNotCompleteTheBatch: when the items
// stream says none of a batch's items is left while lines lack their
// results (as stream information read during a leader change can), the
// batch is not completed with lines it never ran; here the items are gone
// for good (purged), so it runs to its window and expires, every line an
// error that says so.
func TestAStreamThatSaysNoItemIsLeftDoesNotCompleteTheBatch(t *testing.T) {
	// The pool takes lines and never answers them: they stay in flight.
	g := newBatchRig(t, 60*time.Second, func(*nats.Conn) func(*nats.Msg) { return func(*nats.Msg) {} })
	ctx, st := g.ctx, g.st
	const lines = 20
	rec := createBatchUntil(ctx, t, st, chatLines(lines), time.Now().Add(4*time.Second))
	g.run(t, batch.Config{ID: "b1", SuperviseEvery: 50 * time.Millisecond, RequestTimeout: time.Minute})
	js, _ := jetstream.New(g.nc)
	items, err := js.Stream(ctx, subjects.ItemsStream)
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if err != nil {
			items, err = js.Stream(ctx, subjects.ItemsStream)
			return err
		}
		info, ierr := items.Info(ctx)
		if ierr != nil {
			return ierr
		}
		if info.State.Msgs != lines {
			return fmt.Errorf("%d items in the stream, want %d", info.State.Msgs, lines)
		}
		return nil
	})
	if err := items.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	got := awaitDone(ctx, t, st, rec.ID)
	if got.Status != batch.StatusExpired {
		t.Fatalf("the batch ended %s with %+v; want expired at its window, not completed with lines it never ran", got.Status, got.RequestCounts)
	}
	if got.ErrorFileID == nil {
		t.Fatal("no error file")
	}
	for _, l := range readLines(t, st, *got.ErrorFileID) {
		if l.Error == nil || l.Error.Code != batch.CodeBatchExpired {
			t.Errorf("line %s: %+v, want %s", l.CustomID, l.Error, batch.CodeBatchExpired)
		}
	}
}

// TestAnItemWithoutItsBatchIsDroppedOnTheLeadersWord: an item whose batch
// has no record (the bucket's leader says so, not only a replica's read)
// is taken off the stream unanswered, and a batch created after it runs.
func TestAnItemWithoutItsBatchIsDroppedOnTheLeadersWord(t *testing.T) {
	g := newBatchRig(t, 60*time.Second, (&brokerStandIn{tries: map[string]int{}}).serve)
	ctx, st := g.ctx, g.st
	g.run(t, batch.Config{ID: "b1", SuperviseEvery: 50 * time.Millisecond, RequestTimeout: time.Minute})
	rec := createBatch(ctx, t, st, chatLines(3))
	js, _ := jetstream.New(g.nc)
	stray := batch.NewBatchID(time.Now())
	if _, err := js.Publish(ctx, subjects.New("").BatchItems("acme", stray), []byte(`{"line":1,"custom_id":"x","body":{}}`)); err != nil {
		t.Fatal(err)
	}
	got := awaitDone(ctx, t, st, rec.ID)
	if got.Status != batch.StatusCompleted || got.RequestCounts.Completed != 3 {
		t.Fatalf("the batch beside the stray item: %s %+v", got.Status, got.RequestCounts)
	}
	items, err := js.Stream(ctx, subjects.ItemsStream)
	if err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		info, err := items.Info(ctx, jetstream.WithSubjectFilter(subjects.New("").BatchItems("acme", stray)))
		if err != nil {
			return err
		}
		if n := info.State.Subjects[subjects.New("").BatchItems("acme", stray)]; n != 0 {
			return fmt.Errorf("the item of a batch never created is still in the stream (%d)", n)
		}
		return nil
	})
}

// awaitDone waits up to 20 s for acme's batch id to end, whichever way.
func awaitDone(ctx context.Context, t *testing.T, st *batch.Store, id string) *batch.Record {
	t.Helper()
	var got *batch.Record
	testkit.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() (err error) {
		if got, err = st.Batch(ctx, "acme", id); err != nil {
			return err
		}
		switch got.Status {
		case batch.StatusCompleted, batch.StatusExpired, batch.StatusFailed, batch.StatusCancelled:
			return nil
		}
		return fmt.Errorf("status %s", got.Status)
	})
	return got
}
