package loader

import (
	"context"
	"slices"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
	"github.com/switchyard-llm/switchyard/table/kv"
)

// unloadIdle starts the unload of every cold model version with
// idle_unload_after whose live replicas have had no request for that long.
// A request is a load request, a usage event, or a heartbeat with work
// running or waiting; a model up when the loader started gets a full period.
func (l *Loader) unloadIdle(now time.Time) {
	snap := l.watcher.Snapshot()
	if snap == nil {
		return
	}
	type target struct {
		model, version string
		m              *table.Model
		ids            []string
	}
	idle := map[string]*target{}
	l.mu.Lock()
	ctx := l.ctx
	for id, r := range l.replicas {
		m := snap.Models[r.model]
		if m == nil || m.Tier != table.TierCold || m.IdleUnloadAfter <= 0 || now.Sub(r.at) >= liveFor || r.state == subjects.StateDraining || r.state == subjects.StateDisabled {
			continue
		}
		last := l.active[r.model]
		if last.Before(l.started) {
			last = l.started
		}
		k := key(r.model, r.version)
		if now.Sub(last) < time.Duration(m.IdleUnloadAfter) || l.running[k] != nil {
			continue
		}
		t := idle[k]
		if t == nil {
			t = &target{model: r.model, version: r.version, m: m}
			idle[k] = t
		}
		t.ids = append(t.ids, id)
	}
	l.mu.Unlock()
	for k, t := range idle {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ok, err := l.claim(cctx, t.model, t.version, phaseUnloading, now)
		cancel()
		if err != nil {
			l.log.Warn("could not claim an unload", "model", t.model, "err", err)
			continue
		}
		if !ok {
			continue
		}
		slices.Sort(t.ids)
		l.mu.Lock()
		l.running[k] = &job{unload: true, requested: now}
		l.mu.Unlock()
		l.jobs.Go(func() {
			defer func() {
				l.mu.Lock()
				delete(l.running, k)
				l.mu.Unlock()
			}()
			l.unload(ctx, t.model, t.version, t.m, t.ids, now)
		})
	}
}

// unload drains the model version's replicas (no new requests; the ones
// they have finish), runs the unload action, waits for the replicas to go
// and removes their registrations, so the next request loads it again.
func (l *Loader) unload(ctx context.Context, model, version string, m *table.Model, ids []string, began time.Time) {
	st := subjects.LoadStatus{Model: model, Version: version, Phase: subjects.LoadUnloading, StartedUnixMillis: began.UnixMilli()}
	l.publish(st)
	for _, id := range ids {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := kv.SetReplicaState(sctx, l.routing, id, subjects.StateDraining); err != nil {
			l.log.Warn("could not mark a replica draining", "replica", id, "err", err)
		}
		cancel()
	}
	// Brokers stop sending at the draining registration; what the replicas
	// already have runs to the end, within the drain timeout.
	l.waitFor(ctx, l.cfg.DrainTimeout, func() bool { return !l.anyBusy(ids) })
	if ctx.Err() != nil {
		// Stopping before the unload ran: the replicas serve on.
		l.undrain(ids)
		l.releaseClaim(model, version)
		return
	}
	err := l.cfg.Actions.Run(ctx, Op{Unload: true, Model: model, Version: version, Action: m.Unload})
	if ctx.Err() != nil {
		l.releaseClaim(model, version)
		return
	}
	st.ElapsedMillis = time.Since(began).Milliseconds()
	if err != nil {
		l.setClaim(model, version, phaseFailed)
		l.metrics.unloads.WithLabelValues(model, outcomeFailed).Inc()
		st.Phase, st.Error = subjects.LoadFailed, err.Error()
		l.publish(st)
		return
	}
	// The draining state was this loader's doing, not an operator's: once
	// the replicas are gone their keys go too, or a replica coming back
	// under the same id would keep it.
	l.waitFor(ctx, l.cfg.DrainTimeout, func() bool { return !l.anyLive(ids, time.Now()) })
	for _, id := range ids {
		if l.anyLive([]string{id}, time.Now()) {
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := kv.Deregister(dctx, l.routing, id); err != nil {
			l.log.Warn("could not remove an unloaded replica's registration", "replica", id, "err", err)
		}
		cancel()
	}
	l.mu.Lock()
	for _, id := range ids {
		delete(l.replicas, id)
	}
	l.mu.Unlock()
	l.releaseClaim(model, version)
	l.metrics.unloads.WithLabelValues(model, outcomeUnloaded).Inc()
	st.Phase, st.ElapsedMillis = subjects.LoadUnloaded, time.Since(began).Milliseconds()
	l.publish(st)
}

// undrain puts the replicas this loader marked draining back to ready
// (compare-and-set: a change made meanwhile, by an operator or the adapter,
// is left alone).
func (l *Loader) undrain(ids []string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, id := range ids {
		k := table.PrefixReplicas + id
		e, err := l.routing.Get(ctx, k)
		if err != nil {
			continue
		}
		v, err := table.Decode(k, e.Value())
		if err != nil {
			continue
		}
		r := v.V.(table.Replica)
		if r.State != subjects.StateDraining {
			continue
		}
		r.State = subjects.StateReady
		b, err := table.Encode(r)
		if err == nil {
			_, err = l.routing.Update(ctx, k, b, e.Revision())
		}
		if err != nil {
			l.log.Warn("could not undo a replica's drain", "replica", id, "err", err)
		}
	}
}

func (l *Loader) anyBusy(ids []string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		if r := l.replicas[id]; r != nil && r.busy && time.Since(r.at) < liveFor {
			return true
		}
	}
	return false
}

func (l *Loader) anyLive(ids []string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		// A replica still there heartbeats every second; two missed mean gone.
		if r := l.replicas[id]; r != nil && now.Sub(r.at) < 2500*time.Millisecond {
			return true
		}
	}
	return false
}

// waitFor polls cond until it holds, ctx ends or limit passes.
func (l *Loader) waitFor(ctx context.Context, limit time.Duration, cond func() bool) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	end := time.NewTimer(limit)
	defer end.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return
		case <-end.C:
			return
		case <-t.C:
		}
	}
}
