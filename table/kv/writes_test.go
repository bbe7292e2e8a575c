package kv_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
	"github.com/switchyard-llm/switchyard/table/kv"
)

func keysOf(t *testing.T, b jetstream.KeyValue) []string {
	t.Helper()
	keys, err := b.Keys(ctxT(t))
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	return keys
}

func get(t *testing.T, b jetstream.KeyValue, key string) string {
	t.Helper()
	e, err := b.Get(ctxT(t), key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	return string(e.Value())
}

func TestEnsureBucketKeepsHistoryAndAllowsAtomicBatches(t *testing.T) {
	e := newEnv(t)
	st, err := e.kv.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if st.History() != kv.History {
		t.Errorf("history = %d, want %d", st.History(), kv.History)
	}
	info := st.(*jetstream.KeyValueBucketStatus).StreamInfo()
	if !info.Config.AllowAtomicPublish {
		t.Error("atomic publish not allowed")
	}
	// Opening it again changes nothing and needs no create.
	put(t, e.kv, "models.m", `{}`)
	b, err := kv.EnsureBucket(ctxT(t), e.js, bucket, 1)
	if err != nil {
		t.Fatal(err)
	}
	if get(t, b, "models.m") != `{}` {
		t.Error("existing value lost")
	}
}

func TestSeedCreatesOnlyAbsentKeys(t *testing.T) {
	e := newEnv(t)
	flat := devTable(t)
	put(t, e.kv, "tenants.acme", `{"tier":"standard"}`) // an operator's change

	created, err := kv.Seed(ctxT(t), e.kv, flat)
	if err != nil {
		t.Fatal(err)
	}
	if len(created) != len(flat)-1 || slices.Contains(created, "tenants.acme") {
		t.Errorf("created %d keys (%v), want all but tenants.acme", len(created), created)
	}
	if got := get(t, e.kv, "tenants.acme"); got != `{"tier":"standard"}` {
		t.Errorf("seed overwrote tenants.acme: %s", got)
	}
	again, err := kv.Seed(ctxT(t), e.kv, flat)
	if err != nil || len(again) != 0 {
		t.Errorf("second seed created %v, err %v", again, err)
	}

	bad := map[string]json.RawMessage{"models.x": json.RawMessage(`{}`), "models.y": json.RawMessage(`{"tier":"warm"}`)}
	if _, err := kv.Seed(ctxT(t), e.kv, bad); !errors.Is(err, table.ErrInvalid) {
		t.Fatalf("seed with an invalid value: %v", err)
	}
	if _, err := e.kv.Get(ctxT(t), "models.x"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Error("a failed seed wrote models.x")
	}
}

func TestRegisterReplicaNeverClearsAnOperatorsState(t *testing.T) {
	e := newEnv(t)
	r := table.Replica{Model: "llama-3-8b-instruct", Version: "v1.0.0", Pool: "general", MaxBatch: 32, State: subjects.StateLoading}
	if err := kv.RegisterReplica(ctxT(t), e.kv, "l8-gen-0", r); err != nil {
		t.Fatal(err)
	}
	state := func() string {
		t.Helper()
		v, err := table.Decode("replicas.l8-gen-0", []byte(get(t, e.kv, "replicas.l8-gen-0")))
		if err != nil {
			t.Fatal(err)
		}
		return v.V.(table.Replica).State
	}
	if s := state(); s != subjects.StateLoading {
		t.Fatalf("state = %s", s)
	}
	if err := kv.SetReplicaState(ctxT(t), e.kv, "l8-gen-0", subjects.StateReady); err != nil {
		t.Fatal(err)
	}
	if s := state(); s != subjects.StateReady {
		t.Fatalf("state = %s, want ready", s)
	}

	// An operator drains the replica with `nats kv put`.
	put(t, e.kv, "replicas.l8-gen-0", `{"model":"llama-3-8b-instruct","version":"v1.0.0","pool":"general","max_batch":32,"state":"draining"}`)
	r.State = subjects.StateReady
	r.MaxBatch = 64
	if err := kv.RegisterReplica(ctxT(t), e.kv, "l8-gen-0", r); err != nil {
		t.Fatal(err)
	}
	if s := state(); s != subjects.StateDraining {
		t.Errorf("re-registering cleared draining: %s", s)
	}
	if !json.Valid([]byte(get(t, e.kv, "replicas.l8-gen-0"))) || !strings.Contains(get(t, e.kv, "replicas.l8-gen-0"), `"max_batch":64`) {
		t.Error("re-registering did not update the other fields")
	}
	for _, st := range []string{subjects.StateReady, subjects.StateLoading} {
		if err := kv.SetReplicaState(ctxT(t), e.kv, "l8-gen-0", st); err != nil {
			t.Fatal(err)
		}
		if s := state(); s != subjects.StateDraining {
			t.Errorf("SetReplicaState(%s) cleared draining: %s", st, s)
		}
	}
	// More restrictive is allowed; and disabled is kept too.
	if err := kv.SetReplicaState(ctxT(t), e.kv, "l8-gen-0", subjects.StateDisabled); err != nil {
		t.Fatal(err)
	}
	if err := kv.SetReplicaState(ctxT(t), e.kv, "l8-gen-0", subjects.StateDraining); err != nil {
		t.Fatal(err)
	}
	if s := state(); s != subjects.StateDisabled {
		t.Errorf("state = %s, want disabled kept", s)
	}

	if err := kv.Deregister(ctxT(t), e.kv, "l8-gen-0"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.kv.Get(ctxT(t), "replicas.l8-gen-0"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("after Deregister: %v", err)
	}
	if err := kv.SetReplicaState(ctxT(t), e.kv, "l8-gen-0", subjects.StateReady); !errors.Is(err, kv.ErrNotRegistered) {
		t.Errorf("SetReplicaState after Deregister: %v", err)
	}
	// Registering over the delete marker works and starts fresh.
	r.State = subjects.StateReady
	if err := kv.RegisterReplica(ctxT(t), e.kv, "l8-gen-0", r); err != nil {
		t.Fatal(err)
	}
	if s := state(); s != subjects.StateReady {
		t.Errorf("state after re-registration = %s", s)
	}
}

func TestReplicaWritesRejectBadInput(t *testing.T) {
	e := newEnv(t)
	good := table.Replica{Model: "m", Pool: "general", State: subjects.StateReady}
	cases := map[string]error{
		"bad id":    kv.RegisterReplica(ctxT(t), e.kv, "a.b", good),
		"bad state": kv.RegisterReplica(ctxT(t), e.kv, "r1", table.Replica{Model: "m", Pool: "general", State: "busy"}),
		"bad model": kv.RegisterReplica(ctxT(t), e.kv, "r1", table.Replica{Model: "", Pool: "general", State: "ready"}),
		"set bad":   kv.SetReplicaState(ctxT(t), e.kv, "r1", "sleeping"),
	}
	for name, err := range cases {
		if !errors.Is(err, table.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
	if err := kv.Deregister(ctxT(t), e.kv, "a b"); !errors.Is(err, subjects.ErrBadToken) {
		t.Errorf("Deregister with a bad id: %v", err)
	}
	if keys := keysOf(t, e.kv); len(keys) != 0 {
		t.Errorf("bad input wrote %v", keys)
	}
}

// Adapters and an operator race on one key: compare-and-set keeps the
// operator's drain whatever the interleaving.
func TestConcurrentReplicaWritesKeepTheDrain(t *testing.T) {
	e := newEnv(t)
	r := table.Replica{Model: "m", Pool: "general", State: subjects.StateLoading}
	if err := kv.RegisterReplica(ctxT(t), e.kv, "r1", r); err != nil {
		t.Fatal(err)
	}
	if err := kv.SetReplicaState(ctxT(t), e.kv, "r1", subjects.StateDraining); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 5 {
				rr := r
				rr.MaxBatch = i*10 + j
				rr.State = subjects.StateReady
				if err := kv.RegisterReplica(ctxT(t), e.kv, "r1", rr); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	v, err := table.Decode("replicas.r1", []byte(get(t, e.kv, "replicas.r1")))
	if err != nil {
		t.Fatal(err)
	}
	if s := v.V.(table.Replica).State; s != subjects.StateDraining {
		t.Errorf("state = %s after concurrent registrations, want draining", s)
	}
}

func TestImportValidatesWritesAndReports(t *testing.T) {
	for _, atomic := range []bool{true, false} {
		t.Run(fmt.Sprintf("atomic=%v", atomic), func(t *testing.T) {
			e := newEnv(t)
			var opts []kv.ImportOption
			if atomic {
				opts = append(opts, kv.Atomic(e.js))
			}
			flat := devTable(t)

			// Any invalid value: an error naming it, and nothing written.
			bad := maps.Clone(flat)
			bad["models.broken"] = json.RawMessage(`{"tier":"tepid"}`)
			bad["aliases.x"] = json.RawMessage(`{"targets":[]}`)
			_, err := kv.Import(ctxT(t), e.kv, bad, opts...)
			if !errors.Is(err, table.ErrInvalid) {
				t.Fatalf("import with invalid values: %v", err)
			}
			var ke *table.KeyError
			if !errors.As(err, &ke) || (ke.Key != "aliases.x" && ke.Key != "models.broken") {
				t.Errorf("error does not name the key: %v", err)
			}
			if keys := keysOf(t, e.kv); len(keys) != 0 {
				t.Fatalf("a failed import wrote %v", keys)
			}

			rep, err := kv.Import(ctxT(t), e.kv, flat, opts...)
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Created) != len(flat) || len(rep.Updated)+len(rep.Unchanged)+len(rep.Deleted) != 0 || rep.Atomic != atomic {
				t.Errorf("first import: %+v", rep)
			}
			out, err := kv.Export(ctxT(t), e.kv)
			if err != nil {
				t.Fatal(err)
			}
			if len(out) != len(flat) {
				t.Fatalf("export has %d keys, want %d", len(out), len(flat))
			}
			for k, v := range out {
				if _, err := table.Decode(k, v); err != nil {
					t.Errorf("exported %s does not validate: %v", k, err)
				}
			}

			// Change one key, add one, keep the rest; an extra key in the
			// bucket stays without Prune.
			put(t, e.kv, "models.extra", `{}`)
			put(t, e.kv, "replicas.r1", `{"model":"m","pool":"general","state":"ready"}`)
			next := maps.Clone(out)
			next["tenants.trial"] = json.RawMessage(`{"tier":"standard","quota":{"rpm":10}}`)
			next["models.new"] = json.RawMessage(`{"tier": "cold"}`)
			rep, err = kv.Import(ctxT(t), e.kv, next, opts...)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(rep.Created, []string{"models.new"}) || !slices.Equal(rep.Updated, []string{"tenants.trial"}) ||
				len(rep.Unchanged) != len(flat)-1 || len(rep.Deleted) != 0 {
				t.Errorf("second import: created %v updated %v unchanged %d deleted %v", rep.Created, rep.Updated, len(rep.Unchanged), rep.Deleted)
			}
			wantSummary := fmt.Sprintf("created 1, updated 1, unchanged %d", len(flat)-1)
			if atomic {
				wantSummary += " (one atomic batch)"
			}
			if rep.String() != wantSummary {
				t.Errorf("summary %q, want %q", rep.String(), wantSummary)
			}
			if get(t, e.kv, "models.new") != `{"tier":"cold"}` {
				t.Errorf("values are stored compact: %s", get(t, e.kv, "models.new"))
			}

			// Prune deletes keys absent from the file, but not replicas.
			rep, err = kv.Import(ctxT(t), e.kv, next, append(opts, kv.Prune())...)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(rep.Deleted, []string{"models.extra"}) || len(rep.Created)+len(rep.Updated) != 0 {
				t.Errorf("prune: %+v", rep)
			}
			keys := keysOf(t, e.kv)
			if slices.Contains(keys, "models.extra") || !slices.Contains(keys, "replicas.r1") {
				t.Errorf("keys after prune: %v", keys)
			}

			// A deleted key is created again.
			if err := e.kv.Delete(ctxT(t), "models.new"); err != nil {
				t.Fatal(err)
			}
			rep, err = kv.Import(ctxT(t), e.kv, next, opts...)
			if err != nil || !slices.Equal(rep.Created, []string{"models.new"}) {
				t.Errorf("re-import over a delete: %+v, %v", rep, err)
			}
		})
	}
}

// Without atomic publishing on the stream, an Atomic import falls back to
// key-by-key writes.
func TestImportFallsBackWithoutAtomicPublish(t *testing.T) {
	e := newEnv(t)
	b, err := e.js.CreateKeyValue(ctxT(t), jetstream.KeyValueConfig{Bucket: "plain", History: 4})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := kv.Import(ctxT(t), b, devTable(t), kv.Atomic(e.js))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Atomic || len(rep.Created) != len(devTable(t)) {
		t.Errorf("report: atomic %v, created %d", rep.Atomic, len(rep.Created))
	}
}
