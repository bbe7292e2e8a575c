package adapter

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// registerRefresh is how often the registration is checked even when
// nothing changed, so a deleted key or a recreated bucket heals.
const registerRefresh = 10 * time.Second

// casAttempts bounds the compare-and-set retries of one registration.
const casAttempts = 8

// registrar writes the replica's key, replicas.<id>, with compare-and-set.
// Writes are serialised, so the scraper's and the drain's never interleave.
type registrar struct {
	js     jetstream.JetStream
	bucket string
	key    string

	mu      sync.Mutex
	kv      jetstream.KeyValue // nil until the bucket was found
	written []byte             // the value last written or confirmed
	synced  time.Time
	own     string // the adapter's own state at the last sync
	// operator is the draining or disabled an operator put on the key, as
	// last seen: the adapter never wrote it, so deregister keeps the key.
	operator string
}

// register brings replicas.<id> up to date with the adapter's state. Unless
// force is set, it writes only when the value changed or the last check is
// older than registerRefresh.
func (a *Adapter) register(ctx context.Context, force bool) error {
	a.load.mu.Lock()
	flavor := a.load.flavor
	lim := a.limits.withEngine(a.load.sample)
	a.load.mu.Unlock()
	if flavor == "" {
		flavor = a.cfg.Flavor
	}
	want := table.Replica{
		Model:     a.cfg.Model,
		Version:   a.cfg.Version,
		Pool:      a.cfg.Pool,
		Flavor:    flavor,
		MaxBatch:  lim.batch,
		MaxQueue:  lim.queue,
		MaxLoras:  a.cfg.MaxLoras,
		State:     a.state(),
		Role:      a.cfg.Role,
		Endpoints: a.endpoints(),
	}
	return a.reg.sync(ctx, want, force)
}

func (r *registrar) sync(ctx context.Context, want table.Replica, force bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	val, err := table.Encode(want)
	if err != nil {
		return err
	}
	if !force && bytes.Equal(val, r.written) && time.Since(r.synced) < registerRefresh {
		return nil
	}
	if r.kv == nil {
		kv, err := r.js.KeyValue(ctx, r.bucket)
		if err != nil {
			return fmt.Errorf("bucket %s: %w", r.bucket, err)
		}
		r.kv = kv
	}
	for range casAttempts {
		cur, err := r.kv.Get(ctx, r.key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			_, err = r.kv.Create(ctx, r.key, val)
			if errors.Is(err, jetstream.ErrKeyExists) {
				continue // created meanwhile: read it and decide again
			}
			if err == nil {
				r.written, r.synced, r.own, r.operator = val, time.Now(), want.State, ""
			}
			return err
		}
		if err != nil {
			return err
		}
		r.noteOperator(stateOf(cur.Value()))
		r.own = want.State
		next := val
		if kept := keepOperatorState(cur.Value(), want.State); kept != want.State {
			w := want
			w.State = kept
			if next, err = table.Encode(w); err != nil {
				return err
			}
		}
		if bytes.Equal(cur.Value(), next) {
			r.written, r.synced = val, time.Now()
			return nil
		}
		_, err = r.kv.Update(ctx, r.key, next, cur.Revision())
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue
		}
		if err == nil {
			r.written, r.synced = val, time.Now()
		}
		return err
	}
	return fmt.Errorf("%s: compare-and-set lost %d times", r.key, casAttempts)
}

// keepOperatorState returns the state to write over the current value. An
// operator's draining or disabled is never cleared: the more restrictive of
// it and ours is kept. Anything else is the adapter's own and is replaced.
// (A replica that crashed mid-drain leaves its own "draining" behind, which
// its successor also keeps: an operator re-enables it.)
func keepOperatorState(cur []byte, ours string) string {
	var v struct {
		State string `json:"state"`
	}
	if json.Unmarshal(cur, &v) != nil {
		return ours
	}
	if v.State == subjects.StateDraining || v.State == subjects.StateDisabled {
		return subjects.Restrictive(v.State, ours)
	}
	return ours
}

// noteOperator records whether the key's current state is an operator's:
// a draining or disabled the adapter did not choose itself. Lock must be
// held.
func (r *registrar) noteOperator(cur string) {
	switch {
	case cur != subjects.StateDraining && cur != subjects.StateDisabled:
		r.operator = ""
	case cur != r.own:
		r.operator = cur
	}
}

func stateOf(val []byte) string {
	var v struct {
		State string `json:"state"`
	}
	_ = json.Unmarshal(val, &v)
	return v.State
}

// deregister deletes replicas.<id>, unless an operator drained or disabled
// the replica: that choice outlives this process, so its successor (which
// keeps it too) comes up drained. The delete is conditional on the
// revision read, so an operator's write racing it is not lost.
func (r *registrar) deregister(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.kv == nil {
		kv, err := r.js.KeyValue(ctx, r.bucket)
		if err != nil {
			return fmt.Errorf("bucket %s: %w", r.bucket, err)
		}
		r.kv = kv
	}
	r.written = nil
	for range casAttempts {
		cur, err := r.kv.Get(ctx, r.key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		r.noteOperator(stateOf(cur.Value()))
		if r.operator != "" {
			return nil
		}
		err = r.kv.Delete(ctx, r.key, jetstream.LastRevision(cur.Revision()))
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue
		}
		return err
	}
	return fmt.Errorf("%s: conditional delete lost %d times", r.key, casAttempts)
}
