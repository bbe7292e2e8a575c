package batch_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/batch"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/subjects"
)

// echoBroker answers every line at once with a 200 that echoes it, and
// counts the times each line was sent.
type echoBroker struct {
	mu   sync.Mutex
	sent map[string]int
}

func (e *echoBroker) serve(nc *nats.Conn) func(*nats.Msg) {
	return func(m *nats.Msg) {
		var body struct {
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		_ = json.Unmarshal(m.Data, &body)
		key := body.Messages[0].Content
		e.mu.Lock()
		e.sent[key]++
		e.mu.Unlock()
		r := nats.NewMsg(m.Reply)
		r.Header.Set(subjects.HdrSeq, "0")
		r.Header.Set(subjects.HdrEOS, "1")
		r.Header.Set(subjects.HdrStatus, "200")
		r.Data = []byte(`{"object":"chat.completion","echo":` + fmt.Sprintf("%q", key) + `}`)
		_ = nc.PublishMsg(r)
	}
}

// faultyCluster is a 3-server JetStream cluster with a batcher and a
// broker stand-in on it.
type faultyCluster struct {
	c     *natstest.JSCluster
	nc    *nats.Conn // the test's own connection
	js    jetstream.JetStream
	st    *batch.Store
	rec   *batch.Record
	lines int
}

// startFaultyCluster starts it; prepare, if not nil, runs before the
// batcher starts.
func startFaultyCluster(ctx context.Context, t *testing.T, prepare func(jetstream.JetStream)) *faultyCluster {
	t.Helper()
	c := natstest.Cluster(t, 3)
	connect := func(name string) *nats.Conn {
		nc, err := nats.Connect(c.URL(), nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	f := &faultyCluster{c: c, nc: connect("test")}
	f.js, _ = jetstream.New(f.nc)
	if prepare != nil {
		prepare(f.js)
	}
	brokerNC := connect("broker")
	echo := &echoBroker{sent: map[string]int{}}
	if _, err := brokerNC.Subscribe("llm.batch.*", echo.serve(brokerNC)); err != nil {
		t.Fatal(err)
	}
	var err error
	if f.st, err = batch.OpenStore(ctx, f.js, 3); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	b, err := batch.New(connect("batcher"), batch.Config{ID: "b1", SuperviseEvery: 50 * time.Millisecond, AckWait: 2 * time.Second, Replicas: 3, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- b.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done })
	// The batcher is open once it has looked over the batches (its first
	// supervision sets switchyard_batches). A fault before that is not
	// what these tests inject: a batcher that cannot open its stream and
	// buckets stops, and its process is started again.
	testkit.CheckFor(t, time.Minute, 20*time.Millisecond, func() error {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("the batcher stopped: %v", err)
		default:
		}
		mfs, err := reg.Gather()
		if err != nil {
			return err
		}
		for _, mf := range mfs {
			if mf.GetName() == "switchyard_batches" && len(mf.GetMetric()) > 0 {
				return nil
			}
		}
		return errors.New("the batcher has not looked over the batches yet")
	})
	return f
}

// startBatch creates a batch of lines.
func (f *faultyCluster) startBatch(ctx context.Context, t *testing.T, lines int) {
	t.Helper()
	f.lines = lines
	var in strings.Builder
	for i := 1; i <= lines; i++ {
		in.WriteString(line(fmt.Sprint("c", i), "/v1/chat/completions", fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"line %d"}]}`, i)))
	}
	f.rec = createBatch(ctx, t, f.st, in.String())
}

// awaitLeaders waits until each of streams has a leader.
func (f *faultyCluster) awaitLeaders(ctx context.Context, t *testing.T, streams ...string) {
	t.Helper()
	testkit.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		for _, name := range streams {
			s, err := f.js.Stream(ctx, name)
			if err != nil {
				return err
			}
			if info := s.CachedInfo(); info.Cluster == nil || info.Cluster.Leader == "" {
				return fmt.Errorf("%s has no leader", name)
			}
		}
		return nil
	})
}

// server returns the index of the cluster's server named name.
func (f *faultyCluster) server(t *testing.T, name string) int {
	t.Helper()
	for i, srv := range f.c.Servers() {
		if srv != nil && srv.Name() == name {
			return i
		}
	}
	t.Fatalf("no server named %q", name)
	return -1
}

// awaitProgress waits until n lines of the batch are answered.
func (f *faultyCluster) awaitProgress(ctx context.Context, t *testing.T, n int) {
	t.Helper()
	testkit.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		got, err := f.st.Batch(ctx, "acme", f.rec.ID)
		if err != nil {
			return err
		}
		if got.RequestCounts.Completed < n {
			return fmt.Errorf("%s, %d of %d answered", got.Status, got.RequestCounts.Completed, f.lines)
		}
		return nil
	})
}

// awaitWhole waits until the batch completes and checks that each line is
// in the output file once.
func (f *faultyCluster) awaitWhole(ctx context.Context, t *testing.T, within time.Duration) {
	t.Helper()
	var got *batch.Record
	testkit.CheckFor(t, within, 50*time.Millisecond, func() (err error) {
		if got, err = f.st.Batch(ctx, "acme", f.rec.ID); err != nil {
			return err
		}
		if got.Status != batch.StatusCompleted {
			return fmt.Errorf("%s, %+v", got.Status, got.RequestCounts)
		}
		return nil
	})
	if got.RequestCounts.Completed != f.lines || got.OutputFileID == nil {
		t.Fatalf("completed with %+v", got.RequestCounts)
	}
	seen := map[string]bool{}
	for _, l := range readLines(t, f.st, *got.OutputFileID) {
		if seen[l.CustomID] {
			t.Errorf("%s is in the output twice", l.CustomID)
		}
		seen[l.CustomID] = true
	}
	if len(seen) != f.lines {
		t.Errorf("%d lines in the output, want %d", len(seen), f.lines)
	}
}

// The batcher's consumer vanishes mid-batch (a NATS server that lost it,
// an operator's `nats consumer rm`): the batcher opens it again and the
// batch completes, each line once. A batcher that fetched from the
// vanished consumer for ever left its batch in progress with nothing
// answered.
func TestBatcherOpensItsConsumerAgainWhenItVanishes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	f := startFaultyCluster(ctx, t, nil)
	f.startBatch(ctx, t, 600)
	f.awaitProgress(ctx, t, 100)
	s, err := f.js.Stream(ctx, subjects.ItemsStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteConsumer(ctx, "batch-acme"); err != nil {
		t.Fatal(err)
	}
	f.awaitWhole(ctx, t, 45*time.Second)
}

// The NATS server leading the batch items and the batcher's consumer is
// shut down mid-batch and started again: the batch completes, each line
// once.
func TestBatchSurvivesItsItemsLeaderRestarting(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	f := startFaultyCluster(ctx, t, nil)
	f.startBatch(ctx, t, 600)
	f.awaitProgress(ctx, t, 100)
	s, err := f.js.Stream(ctx, subjects.ItemsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil || info.Cluster == nil {
		t.Fatalf("the items stream: %v", err)
	}
	leader := f.server(t, info.Cluster.Leader)
	f.c.Stop(leader)
	f.c.Start(leader)
	// A bound for a loaded machine, where the rest of the batch can take
	// more than 90 s once the leader is back.
	f.awaitWhole(ctx, t, 3*time.Minute)
}

// A batch created while its items stream cannot store anything (its only
// server is away, as after a frozen NATS server while the stream's
// leader moves) stays validating and is expanded once the stream is back:
// every line runs. The expansion took the stream's refusals for stored
// items, and the batch completed at once with every line lost.
func TestBatchWaitsForItsItemsToBeStored(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var home string
	f := startFaultyCluster(ctx, t, func(js jetstream.JetStream) {
		// The items on one server, so that stopping it stops them and
		// nothing else.
		s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: subjects.ItemsStream, Subjects: []string{subjects.New("").BatchItemsAll()},
			Retention: jetstream.WorkQueuePolicy, Duplicates: 10 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		home = s.CachedInfo().Cluster.Leader
	})
	i := f.server(t, home)
	f.c.Stop(i)
	f.c.WaitLeader()
	f.awaitLeaders(ctx, t, "OBJ_"+subjects.FilesBucket, "KV_"+subjects.BatchesBucket, "KV_"+subjects.ResultsBucket)
	f.startBatch(ctx, t, 300)
	if _, err := testkit.Poll(3*time.Second, 20*time.Millisecond, func() error {
		got, err := f.st.Batch(ctx, "acme", f.rec.ID)
		if err == nil && batch.Done(got.Status) {
			return nil
		}
		return fmt.Errorf("%v: not done", err)
	}); err == nil {
		got, _ := f.st.Batch(ctx, "acme", f.rec.ID)
		t.Fatalf("the batch ended while its items could not be stored: %s %+v", got.Status, got.RequestCounts)
	}
	f.c.Start(i)
	f.awaitWhole(ctx, t, 60*time.Second)
}
