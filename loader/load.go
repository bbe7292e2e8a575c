package loader

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// startLoad runs a claimed load on its own goroutine, owned by Run: none
// starts once Run is waiting for its jobs to end.
func (l *Loader) startLoad(ctx context.Context, model, version string, m *table.Model, requested time.Time) {
	k := key(model, version)
	ready := make(chan struct{})
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return
	}
	l.running[k] = &job{requested: requested}
	l.ready[k] = ready
	expected := l.expectedLocked(model, m)
	l.jobs.Add(1)
	l.mu.Unlock()
	st := subjects.LoadStatus{Model: model, Version: version, StartedUnixMillis: requested.UnixMilli(), ExpectedMillis: expected.Milliseconds()}
	st.Phase = subjects.LoadRequested
	l.publish(st)
	action := m.Load
	go func() {
		defer l.jobs.Done()
		defer func() {
			l.mu.Lock()
			delete(l.running, k)
			if l.ready[k] == ready {
				delete(l.ready, k)
			}
			l.mu.Unlock()
		}()
		l.load(ctx, st, action, requested, ready)
	}()
}

// expectedLocked is how long a load of model is expected to take: the
// table's expected_load_seconds, else the last measured time to ready.
// Lock must be held.
func (l *Loader) expectedLocked(model string, m *table.Model) time.Duration {
	if m.ExpectedLoadSeconds > 0 {
		return time.Duration(m.ExpectedLoadSeconds * float64(time.Second))
	}
	return l.measured[model]
}

func (l *Loader) load(ctx context.Context, st subjects.LoadStatus, action *table.Action, requested time.Time, ready <-chan struct{}) {
	lctx, cancel := context.WithDeadline(ctx, requested.Add(l.cfg.LoadTimeout))
	defer cancel()
	err := l.cfg.Actions.Run(lctx, Op{Model: st.Model, Version: st.Version, Action: action})
	if err == nil {
		st.Phase, st.ElapsedMillis = subjects.LoadStarted, time.Since(requested).Milliseconds()
		l.publish(st)
		select {
		case <-ready:
		case <-lctx.Done():
			err = fmt.Errorf("no replica of %s heartbeat ready within %s", st.Model, l.cfg.LoadTimeout)
		}
	}
	if ctx.Err() != nil {
		// The loader is stopping: leave the load to another loader.
		l.releaseClaim(st.Model, st.Version)
		return
	}
	took := time.Since(requested)
	st.ElapsedMillis = took.Milliseconds()
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("the load action did not finish within %s", l.cfg.LoadTimeout)
		}
		l.setClaim(st.Model, st.Version, phaseFailed)
		l.metrics.loads.WithLabelValues(st.Model, outcomeFailed).Inc()
		st.Phase, st.Error, st.RetryAfterMillis = subjects.LoadFailed, err.Error(), l.cfg.Cooldown.Milliseconds()
		l.publish(st)
		return
	}
	l.mu.Lock()
	l.measured[st.Model] = took
	l.active[st.Model] = time.Now() // the request that asked for it is about to be served
	l.mu.Unlock()
	l.setClaim(st.Model, st.Version, phaseReady)
	l.metrics.loads.WithLabelValues(st.Model, outcomeReady).Inc()
	l.metrics.timeToReady.WithLabelValues(st.Model).Observe(took.Seconds())
	st.Phase = subjects.LoadReady
	l.publish(st)
}
