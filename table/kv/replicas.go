package kv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// ErrNotRegistered is returned when a replica's key is absent.
var ErrNotRegistered = errors.New("replica not registered")

// ErrConflict is returned when a key kept changing under a compare-and-set
// loop.
var ErrConflict = errors.New("routing table key kept changing")

// casAttempts bounds every compare-and-set loop.
const casAttempts = 16

// casPause waits a little before a compare-and-set attempt that follows a
// lost one, growing with the attempts and jittered, so writers racing on one
// key stop colliding.
func casPause(ctx context.Context, attempt int) error {
	if attempt == 0 {
		return nil
	}
	d := time.Duration(rand.Int64N(int64(attempt) * int64(2*time.Millisecond)))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func isConflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists)
}

// operatorState keeps an operator's draining or disabled in force: a write by
// the adapter may make the state more restrictive, never less
// (docs/protocol.md, "Routing table").
func operatorState(current, want string) string {
	if current == subjects.StateDraining || current == subjects.StateDisabled {
		return subjects.Restrictive(current, want)
	}
	return want
}

// currentState reads only the state of a stored replica value, so that an
// operator's drain is honoured even when another field of the value is bad.
func currentState(b []byte) string {
	var v struct {
		State string `json:"state"`
	}
	_ = json.Unmarshal(b, &v)
	return v.State
}

func encodeReplica(key string, r table.Replica) ([]byte, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	if _, err := table.Decode(key, b); err != nil {
		return nil, err
	}
	return b, nil
}

// RegisterReplica writes replicas.<id> with compare-and-set: created when
// absent, else updated, keeping an operator's draining or disabled state.
func RegisterReplica(ctx context.Context, kv jetstream.KeyValue, id string, r table.Replica) error {
	key := table.PrefixReplicas + id
	if _, err := encodeReplica(key, r); err != nil {
		return err
	}
	for attempt := range casAttempts {
		if err := casPause(ctx, attempt); err != nil {
			return err
		}
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			b, _ := encodeReplica(key, r)
			_, err = kv.Create(ctx, key, b)
			if isConflict(err) {
				continue
			}
			return err
		}
		if err != nil {
			return err
		}
		want := r
		want.State = operatorState(currentState(e.Value()), r.State)
		b, err := encodeReplica(key, want)
		if err != nil {
			return err
		}
		if bytes.Equal(b, e.Value()) {
			return nil
		}
		_, err = kv.Update(ctx, key, b, e.Revision())
		if isConflict(err) {
			continue
		}
		return err
	}
	return fmt.Errorf("%w: %s", ErrConflict, key)
}

// SetReplicaState changes the state of a registered replica with
// compare-and-set. An operator's draining or disabled is never cleared: a
// less restrictive state leaves it in force and returns nil.
func SetReplicaState(ctx context.Context, kv jetstream.KeyValue, id, state string) error {
	key := table.PrefixReplicas + id
	if !subjects.ValidState(state) {
		return &table.KeyError{Key: key, Field: "state", Err: fmt.Errorf("want loading, ready, draining or disabled, got %q", state)}
	}
	for attempt := range casAttempts {
		if err := casPause(ctx, attempt); err != nil {
			return err
		}
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("%w: %s", ErrNotRegistered, id)
		}
		if err != nil {
			return err
		}
		v, err := table.Decode(key, e.Value())
		if err != nil {
			return err
		}
		r := v.V.(table.Replica)
		next := operatorState(r.State, state)
		if next == r.State {
			return nil
		}
		r.State = next
		b, err := encodeReplica(key, r)
		if err != nil {
			return err
		}
		_, err = kv.Update(ctx, key, b, e.Revision())
		if isConflict(err) {
			continue
		}
		return err
	}
	return fmt.Errorf("%w: %s", ErrConflict, key)
}

// Deregister deletes replicas.<id> (keeping its history).
func Deregister(ctx context.Context, kv jetstream.KeyValue, id string) error {
	if err := subjects.ValidToken(id); err != nil {
		return err
	}
	return kv.Delete(ctx, table.PrefixReplicas+id)
}
