package adapter_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// TestStopKeepsAnOperatorsChoice checks that an operator's drained or
// disabled replica stays so across an adapter restart: the stopping adapter
// leaves the key, and its successor registers without clearing the state.
// The adapter's own drain, by contrast, deregisters (TestDrain).
func TestStopKeepsAnOperatorsChoice(t *testing.T) {
	for _, state := range []string{subjects.StateDisabled, subjects.StateDraining} {
		t.Run(state, func(t *testing.T) {
			e := newEnv(t)
			run := e.start(e.config())
			e.waitReady("r-1")
			if _, err := e.kv.Put(context.Background(), "replicas.r-1",
				[]byte(`{"model":"sim-model","version":"v1","pool":"general","state":"`+state+`"}`)); err != nil {
				t.Fatal(err)
			}
			// The adapter sees the operator's value at its next check at the
			// latest; a stop right now must not lose it either.
			if err := run.stop(t); err != nil {
				t.Fatal(err)
			}
			r, err := e.replica("r-1")
			if err != nil {
				t.Fatalf("the operator's %s key was deleted: %v", state, err)
			}
			if r.State != state {
				t.Fatalf("state after the stop %q, want %q", r.State, state)
			}
			// The successor registers its fields and keeps the state.
			e.start(e.config())
			testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
				r, err := e.replica("r-1")
				if err != nil {
					return err
				}
				if r.MaxBatch != 32 {
					return fmt.Errorf("not re-registered: %+v", r)
				}
				if r.State != state {
					return fmt.Errorf("successor wrote %q over the operator's %q", r.State, state)
				}
				return nil
			})

			// Once the operator re-enables it, a stop deregisters as usual.
			if _, err := e.kv.Put(context.Background(), "replicas.r-1",
				[]byte(`{"model":"sim-model","version":"v1","pool":"general","state":"ready"}`)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestStopDeregistersItsOwnDrain checks the other side: with no operator
// involved, the adapter's own draining is not mistaken for one.
func TestStopDeregistersItsOwnDrain(t *testing.T) {
	e := newEnv(t)
	run := e.start(e.config())
	e.waitReady("r-1")
	if err := run.stop(t); err != nil {
		t.Fatal(err)
	}
	if _, err := e.kv.Get(context.Background(), "replicas.r-1"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("key after the stop: %v, want deleted", err)
	}
}
