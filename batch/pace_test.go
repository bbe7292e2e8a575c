package batch_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/batch"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// poolStandIn answers llm.batch.* as a pool that holds capacity lines at
// a time: each is answered after serve, and a line beyond capacity is
// refused at once, 503 with a Retry-After, as an adapter refuses a line
// past its hold. most is the most it ever held.
type poolStandIn struct {
	capacity int
	serve    time.Duration
	// maxBatch, when set, makes the pool an adapter too: it publishes a
	// heartbeat of replica r-1 with this max_batch first, and a load
	// delta after each change of what it holds, as an adapter does.
	maxBatch int
	mu       sync.Mutex
	held     int
	most     int
	hbSeq    uint64
	deltas   uint64
}

// heartbeat publishes r-1's heartbeat.
func (p *poolStandIn) heartbeat(t *testing.T, nc *nats.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.heartbeatLocked(nc); err != nil {
		t.Fatal(err)
	}
}

// Lock should be held.
func (p *poolStandIn) heartbeatLocked(nc *nats.Conn) error {
	p.hbSeq++
	return nc.Publish("llm.heartbeat.r-1", fmt.Appendf(nil, `{"replica":"r-1","pool":"general","state":"ready","scrape_ok":true,"max_batch":%d,"running":%d,"inflight":%d,"seq":%d}`,
		p.maxBatch, p.held, p.held, p.hbSeq))
}

// loadDelta publishes what the pool holds now, and every 50 changes a
// heartbeat instead, so that the view stays fresh as an adapter's does.
// Lock should be held.
func (p *poolStandIn) loadDelta(nc *nats.Conn) {
	if p.maxBatch == 0 {
		return
	}
	if p.deltas++; p.deltas%50 == 0 {
		_ = p.heartbeatLocked(nc)
		return
	}
	_ = nc.Publish("llm.load.r-1", fmt.Appendf(nil, `{"replica":"r-1","hb_seq":%d,"seq":%d,"inflight":%d}`, p.hbSeq, p.deltas, p.held))
}

func (p *poolStandIn) take(nc *nats.Conn) func(*nats.Msg) {
	return func(m *nats.Msg) {
		r := nats.NewMsg(m.Reply)
		r.Header.Set(subjects.HdrSeq, "0")
		r.Header.Set(subjects.HdrEOS, "1")
		p.mu.Lock()
		if p.held >= p.capacity {
			p.mu.Unlock()
			r.Header.Set(subjects.HdrStatus, "503")
			r.Header.Set(subjects.HdrRetryAfterMS, "100")
			r.Header.Set(subjects.HdrRouteReplica, "r-1")
			r.Data = subjects.NewError(503, subjects.CodeAllReplicasBusy, "no room for batch work").Body()
			_ = nc.PublishMsg(r)
			return
		}
		p.held++
		p.most = max(p.most, p.held)
		p.loadDelta(nc)
		p.mu.Unlock()
		if p.maxBatch > 0 {
			acc := nats.NewMsg(m.Reply)
			acc.Header.Set(subjects.HdrSeq, "0")
			acc.Header.Set(subjects.HdrAccepted, "r-1")
			_ = nc.PublishMsg(acc)
		}
		time.AfterFunc(p.serve, func() {
			p.mu.Lock()
			p.held--
			p.loadDelta(nc)
			p.mu.Unlock()
			r.Header.Set(subjects.HdrSeq, "1")
			if p.maxBatch == 0 {
				r.Header.Set(subjects.HdrAccepted, "r-1") // no accept went alone: it rides on the head
			}
			r.Header.Set(subjects.HdrStatus, "200")
			r.Data = []byte(`{"object":"chat.completion"}`)
			_ = nc.PublishMsg(r)
		})
	}
}

// TestTheWindowKeepsThePoolFullWithFewRefusals: against a pool that holds
// 20 lines, the batcher's window settles at what the pool holds: the pool
// is filled (a line that ends is replaced at once), a refusal does not
// close the window, and lines are refused about once per window of
// answers, not in a stream; each line is answered once.
func TestTheWindowKeepsThePoolFullWithFewRefusals(t *testing.T) {
	pool := &poolStandIn{capacity: 20, serve: 20 * time.Millisecond}
	g := newBatchRig(t, 90*time.Second, pool.take)
	ctx, st := g.ctx, g.st
	const lines = 600
	rec := createBatch(ctx, t, st, chatLines(lines))
	reg := prometheus.NewRegistry()
	g.run(t, batch.Config{ID: "b1", SuperviseEvery: 50 * time.Millisecond, Registerer: reg})

	var got *batch.Record
	minWindow := float64(batch.DefaultConcurrency)
	testkit.CheckFor(t, 80*time.Second, 20*time.Millisecond, func() (err error) {
		if w := testkit.Sum(reg, "switchyard_batch_window", nil); pool.mostHeld() >= pool.capacity && w < minWindow {
			minWindow = w
		}
		if got, err = st.Batch(ctx, "acme", rec.ID); err != nil {
			return err
		}
		if got.Status != batch.StatusCompleted {
			return fmt.Errorf("status %s %+v", got.Status, got.RequestCounts)
		}
		return nil
	})
	if got.RequestCounts != (batch.RequestCounts{Total: lines, Completed: lines}) {
		t.Fatalf("completed: %+v", got.RequestCounts)
	}
	if n := len(readLines(t, st, *got.OutputFileID)); n != lines {
		t.Errorf("%d output lines, want %d", n, lines)
	}
	refused := testkit.Sum(reg, "switchyard_batch_refusals_total", map[string]string{"from": "adapter"})
	t.Logf("%v refusals for %d lines; the pool held at most %d; the window at least %v once the pool was full", refused, lines, pool.mostHeld(), minWindow)
	if pool.mostHeld() < pool.capacity {
		t.Errorf("the pool held at most %d lines, never its %d", pool.mostHeld(), pool.capacity)
	}
	if refused > lines/5 {
		t.Errorf("%v refusals for %d lines through a pool of %d: the window kept sending lines to be refused", refused, lines, pool.capacity)
	}
	if minWindow < float64(pool.capacity)/2 {
		t.Errorf("the window fell to %v with the pool full at %d: refusals closed it", minWindow, pool.capacity)
	}
}

func (p *poolStandIn) mostHeld() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.most
}

// TestTheBatchFillsTheRoomTheLoadViewShows: a pool that is also an adapter
// (a heartbeat with a max_batch of 32, a load delta on every change) shows
// the batcher its room, ¾ of the batch: the batcher fills it without
// learning it from refusals (at most a handful, against one per window of
// answers when it must), never sends the pool more than that room, and
// answers each line once.
func TestTheBatchFillsTheRoomTheLoadViewShows(t *testing.T) {
	pool := &poolStandIn{capacity: 24, maxBatch: 32, serve: 20 * time.Millisecond}
	g := newBatchRig(t, 90*time.Second, pool.take)
	ctx, st := g.ctx, g.st
	const lines = 600
	reg := prometheus.NewRegistry()
	g.run(t, batch.Config{ID: "b1", SuperviseEvery: 50 * time.Millisecond, Registerer: reg})
	// The batcher hears the heartbeat before the batch exists.
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		pool.heartbeat(t, g.nc)
		if f := testkit.Sum(reg, "switchyard_batch_room", map[string]string{"kind": "free"}); f != 24 {
			return fmt.Errorf("the batcher sees %v free, want 24", f)
		}
		return nil
	})
	rec := createBatch(ctx, t, st, chatLines(lines))
	start := time.Now()
	var got *batch.Record
	testkit.CheckFor(t, 80*time.Second, 20*time.Millisecond, func() (err error) {
		if got, err = st.Batch(ctx, "acme", rec.ID); err != nil {
			return err
		}
		if got.Status != batch.StatusCompleted {
			return fmt.Errorf("status %s %+v", got.Status, got.RequestCounts)
		}
		return nil
	})
	if got.RequestCounts != (batch.RequestCounts{Total: lines, Completed: lines}) {
		t.Fatalf("completed: %+v", got.RequestCounts)
	}
	if n := len(readLines(t, st, *got.OutputFileID)); n != lines {
		t.Errorf("%d output lines, want %d", n, lines)
	}
	refused := testkit.Sum(reg, "switchyard_batch_refusals_total", nil)
	t.Logf("%v refusals for %d lines in %v; the pool held at most %d of its room of %d", refused, lines, time.Since(start).Round(time.Millisecond), pool.mostHeld(), pool.capacity)
	if pool.mostHeld() < pool.capacity {
		t.Errorf("the pool held at most %d lines, never its room of %d", pool.mostHeld(), pool.capacity)
	}
	if refused > lines/50 {
		t.Errorf("%v refusals for %d lines with the room in view: the batcher still learns it from refusals", refused, lines)
	}
}

// TestBatchersShareTheRoom: two batchers over the same pool count each
// other from their announcements and each takes half the room the view
// shows (12 of 24), so together they fill it and are refused a fraction
// as often as batchers that each took the whole room, and each answers
// lines of the batch.
func TestBatchersShareTheRoom(t *testing.T) {
	pool := &poolStandIn{capacity: 24, maxBatch: 32, serve: 20 * time.Millisecond}
	g := newBatchRig(t, 90*time.Second, pool.take)
	ctx, st := g.ctx, g.st
	const lines = 600
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	for i, reg := range regs {
		g.run(t, batch.Config{ID: fmt.Sprint("b", i+1), SuperviseEvery: 50 * time.Millisecond, Registerer: reg})
	}
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		pool.heartbeat(t, g.nc)
		for i, reg := range regs {
			if n, share := testkit.Sum(reg, "switchyard_batchers", nil), testkit.Sum(reg, "switchyard_batch_room", map[string]string{"kind": "share"}); n != 2 || share != 12 {
				return fmt.Errorf("batcher b%d counts %v batchers and a share of %v, want 2 and 12", i+1, n, share)
			}
		}
		return nil
	})
	rec := createBatch(ctx, t, st, chatLines(lines))
	var got *batch.Record
	testkit.CheckFor(t, 80*time.Second, 20*time.Millisecond, func() (err error) {
		if got, err = st.Batch(ctx, "acme", rec.ID); err != nil {
			return err
		}
		if got.Status != batch.StatusCompleted {
			return fmt.Errorf("status %s %+v", got.Status, got.RequestCounts)
		}
		return nil
	})
	if got.RequestCounts != (batch.RequestCounts{Total: lines, Completed: lines}) {
		t.Fatalf("completed: %+v", got.RequestCounts)
	}
	if n := len(readLines(t, st, *got.OutputFileID)); n != lines {
		t.Errorf("%d output lines, want %d", n, lines)
	}
	refused := 0.0
	for i, reg := range regs {
		refused += testkit.Sum(reg, "switchyard_batch_refusals_total", nil)
		if n := testkit.Sum(reg, "switchyard_batch_items_total", map[string]string{"outcome": "completed"}); n == 0 {
			t.Errorf("batcher b%d answered no line", i+1)
		}
	}
	t.Logf("%v refusals for %d lines through two batchers; the pool held at most %d of its room of %d", refused, lines, pool.mostHeld(), pool.capacity)
	// A line one batcher has sent that the pool has not yet counted is
	// unseen by the other, which may take the same slot: shared, the two
	// are refused 5–14 times a run (more on a loaded machine); each
	// taking the whole room, 44–50 times.
	if refused > lines/25 {
		t.Errorf("%v refusals for %d lines: the two batchers took more than their shares", refused, lines)
	}
}
