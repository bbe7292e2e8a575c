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
	mu       sync.Mutex
	held     int
	most     int
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
		p.mu.Unlock()
		time.AfterFunc(p.serve, func() {
			p.mu.Lock()
			p.held--
			p.mu.Unlock()
			r.Header.Set(subjects.HdrSeq, "1")
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
