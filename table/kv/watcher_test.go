package kv_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/table"
	"github.com/switchyard-llm/switchyard/table/kv"
)

func TestWatcherLoadsTheInitialValues(t *testing.T) {
	e := newEnv(t)
	created, err := kv.Seed(ctxT(t), e.kv, devTable(t))
	if err != nil {
		t.Fatal(err)
	}
	status, err := e.kv.Status(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	lastRev := status.(*jetstream.KeyValueBucketStatus).StreamInfo().State.LastSeq

	w, rec := startWatcher(t, e.js, kv.Config{})
	if w.Snapshot() != nil && w.Source() == "" {
		t.Fatal("a snapshot without a source")
	}
	waitReady(t, w)
	s := w.Snapshot()
	if got := len(s.Raw); got != len(created) {
		t.Errorf("snapshot has %d keys, want %d", got, len(created))
	}
	if s.Revision != lastRev {
		t.Errorf("Revision = %d, want the bucket's last revision %d", s.Revision, lastRev)
	}
	if w.Source() != kv.SourceKV {
		t.Errorf("Source = %q", w.Source())
	}
	if a := s.Aliases["chat-large"]; a == nil || len(a.Targets) != 2 || a.Targets[1].Version != "v1.6.0" {
		t.Errorf("aliases.chat-large = %+v", a)
	}
	if s.Tenants["acme"] == nil || s.Tenants["acme"].Tier != table.TierPremium {
		t.Errorf("tenants.acme = %+v", s.Tenants["acme"])
	}
	if !s.Policy.AllowAnonymous {
		t.Error("policy not applied")
	}
	if n := len(rec.snapshots()); n != 1 {
		t.Errorf("%d snapshots published for the initial values, want 1", n)
	}
	if w.Age() < 0 || w.Age() > time.Minute {
		t.Errorf("Age = %v", w.Age())
	}
}

func TestWatcherOnAnEmptyBucketIsReady(t *testing.T) {
	e := newEnv(t)
	w, _ := startWatcher(t, e.js, kv.Config{})
	waitReady(t, w)
	if s := w.Snapshot(); len(s.Raw) != 0 || s.Policy.LongContextTokens != table.DefaultPolicy().LongContextTokens {
		t.Errorf("empty bucket gave %+v", s)
	}
}

func TestInvalidValueKeepsThePreviousGoodOne(t *testing.T) {
	e := newEnv(t)
	put(t, e.kv, "models.m1", `{"tier":"hot","max_context_tokens":1000}`)
	w, rec := startWatcher(t, e.js, kv.Config{})
	waitReady(t, w)

	put(t, e.kv, "models.m1", `{"tier":"lukewarm"}`)
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if rec.invalidCount("models.m1") != 1 {
			return errors.New("OnInvalid not called for models.m1")
		}
		return nil
	})

	put(t, e.kv, "models.marker", `{}`) // a later good write shows the bad one was processed
	snapshotHas(t, w, "models.marker", "{}")
	if m := w.Snapshot().Models["m1"]; m == nil || m.Tier != "hot" || m.MaxContextTokens != 1000 {
		t.Fatalf("models.m1 = %+v, want the previous good value", m)
	}

	// A key that never had a good value stays absent.
	put(t, e.kv, "tenants.bad", `{"tier": 3}`)
	put(t, e.kv, "nonsense", `{}`)
	put(t, e.kv, "models.marker", `{"tier":"cold"}`)
	snapshotHas(t, w, "models.marker", "cold")
	if _, ok := w.Snapshot().Raw["tenants.bad"]; ok {
		t.Error("an invalid new key was applied")
	}
	if rec.invalidCount("tenants.bad") != 1 || rec.invalidCount("nonsense") != 1 {
		t.Errorf("OnInvalid counts: %v", rec.invalid)
	}

	// A good value replaces it again.
	put(t, e.kv, "models.m1", `{"tier":"cold"}`)
	snapshotHas(t, w, "models.m1", "cold")

	// So with the disaggregation of a model and the role of a replica.
	put(t, e.kv, "models.pd", `{"disaggregation":{"enabled":true,"min_uncached_tokens":4096}}`)
	put(t, e.kv, "replicas.p1", `{"model":"pd","pool":"general","state":"ready","role":"prefill"}`)
	snapshotHas(t, w, "replicas.p1", "prefill")
	put(t, e.kv, "models.pd", `{"disaggregation":{"enabled":true,"min_uncached_tokens":-4096}}`)
	put(t, e.kv, "replicas.p1", `{"model":"pd","pool":"general","state":"ready","role":"prefil"}`)
	put(t, e.kv, "models.marker", `{"tier":"hot"}`)
	snapshotHas(t, w, "models.marker", "hot")
	if rec.invalidCount("models.pd") != 1 || rec.invalidCount("replicas.p1") != 1 {
		t.Errorf("OnInvalid counts: %v", rec.invalid)
	}
	s := w.Snapshot()
	if m := s.Models["pd"]; !m.Splits() || m.Disaggregation.MinUncachedTokens != 4096 {
		t.Errorf("models.pd = %+v, want the previous good value", m)
	}
	if r := s.Replicas["p1"]; r == nil || r.Role != table.RolePrefill {
		t.Errorf("replicas.p1 = %+v, want the previous good value", r)
	}
}

func TestDeleteAndPurgeRemoveKeys(t *testing.T) {
	e := newEnv(t)
	put(t, e.kv, "models.a", `{}`)
	put(t, e.kv, "models.b", `{}`)
	put(t, e.kv, "policy", `{"long_context_tokens": 9000}`)
	w, _ := startWatcher(t, e.js, kv.Config{})
	waitReady(t, w)
	if w.Snapshot().Policy.LongContextTokens != 9000 {
		t.Fatal("policy not loaded")
	}

	if err := e.kv.Delete(ctxT(t), "models.a"); err != nil {
		t.Fatal(err)
	}
	snapshotHas(t, w, "models.a", "")
	if err := e.kv.Purge(ctxT(t), "models.b"); err != nil {
		t.Fatal(err)
	}
	snapshotHas(t, w, "models.b", "")
	if err := e.kv.Delete(ctxT(t), "policy"); err != nil {
		t.Fatal(err)
	}
	snapshotHas(t, w, "policy", "")
	s := w.Snapshot()
	if s.Policy.LongContextTokens != table.DefaultPolicy().LongContextTokens {
		t.Errorf("deleted policy left %d in force", s.Policy.LongContextTokens)
	}
	if len(s.Models) != 0 {
		t.Errorf("models left: %v", slices.Collect(maps.Keys(s.Models)))
	}

	// A watcher started after the deletes does not see the keys either.
	w2, _ := startWatcher(t, e.js, kv.Config{})
	waitReady(t, w2)
	if n := len(w2.Snapshot().Raw); n != 0 {
		t.Errorf("new watcher sees %d keys", n)
	}
}

// A multi-key import is never seen half-done: every snapshot holds all of its
// keys or none.
func TestImportIsSeenWhole(t *testing.T) {
	e := newEnv(t)
	w, rec := startWatcher(t, e.js, kv.Config{})
	waitReady(t, w)

	for round := range 3 {
		flat := map[string]json.RawMessage{}
		for i := range 40 {
			flat[fmt.Sprintf("models.m%02d", i)] = json.RawMessage(fmt.Sprintf(`{"max_context_tokens": %d}`, 1000*(round+1)+i))
		}
		rep, err := kv.Import(ctxT(t), e.kv, flat, kv.Atomic(e.js))
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Atomic {
			t.Fatal("import was not atomic on a bucket made by EnsureBucket")
		}
		want := fmt.Sprintf("%d", 1000*(round+1)+39)
		snapshotHas(t, w, "models.m39", want)
	}

	for _, s := range rec.snapshots() {
		if len(s.Models) != 0 && len(s.Models) != 40 {
			t.Fatalf("snapshot at revision %d has %d of 40 models", s.Revision, len(s.Models))
		}
		// Values of one import round are never mixed with another's.
		rounds := map[int]bool{}
		for _, m := range s.Models {
			rounds[m.MaxContextTokens/1000] = true
		}
		if len(rounds) > 1 {
			t.Fatalf("snapshot at revision %d mixes import rounds %v", s.Revision, rounds)
		}
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if n := len(rec.snapshots()); n != 4 {
			return fmt.Errorf("%d snapshots, want 4 (initial + one per import)", n)
		}
		return nil
	})
}

func TestSnapshotIsPersistedAndServedWithoutJetStream(t *testing.T) {
	e := newEnv(t)
	state := t.TempDir()
	if _, err := kv.Seed(ctxT(t), e.kv, devTable(t)); err != nil {
		t.Fatal(err)
	}
	w, _ := startWatcher(t, e.js, kv.Config{StateDir: state})
	waitReady(t, w)
	put(t, e.kv, "models.extra", `{"tier":"cold"}`)
	snapshotHas(t, w, "models.extra", "cold")
	want := w.Snapshot()

	path := filepath.Join(state, kv.StateFile)
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		var st struct {
			Revision uint64                     `json:"revision"`
			Values   map[string]json.RawMessage `json:"values"`
		}
		if err := json.Unmarshal(b, &st); err != nil {
			return err
		}
		if st.Revision != want.Revision || len(st.Values) != len(want.Raw) {
			return fmt.Errorf("state file at revision %d with %d keys, want %d with %d", st.Revision, len(st.Values), want.Revision, len(want.Raw))
		}
		return nil
	})

	if tmp, _ := filepath.Glob(filepath.Join(state, ".table-*")); len(tmp) != 0 {
		t.Errorf("temporary files left: %v", tmp)
	}

	// A server without JetStream: the watcher serves the persisted table.
	noJS := natstest.RunServer(t, &server.Options{Port: server.RANDOM_PORT})
	_, js := connect(t, noJS.ClientURL())
	start := time.Now()
	w2, _ := startWatcher(t, js, kv.Config{StateDir: state, InitialTimeout: 500 * time.Millisecond})
	waitReady(t, w2)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v to fall back", d)
	}
	got := w2.Snapshot()
	if w2.Source() != kv.SourceStateDir {
		t.Errorf("Source = %q", w2.Source())
	}
	if got.Revision != want.Revision || len(got.Raw) != len(want.Raw) || got.Models["extra"] == nil {
		t.Errorf("persisted snapshot: revision %d, %d keys; want %d, %d", got.Revision, len(got.Raw), want.Revision, len(want.Raw))
	}
	if w2.Age() <= 0 {
		t.Errorf("Age of a persisted snapshot = %v", w2.Age())
	}
}

func TestMissingBucketFallsBackThenRecovers(t *testing.T) {
	e := newEnv(t)
	state := t.TempDir()
	// Persist a table from the bucket.
	put(t, e.kv, "models.old", `{}`)
	w, _ := startWatcher(t, e.js, kv.Config{StateDir: state})
	waitReady(t, w)
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		_, err := os.Stat(filepath.Join(state, kv.StateFile))
		return err
	})

	// Another server where the bucket does not exist yet.
	_, url := natstest.Start(t)
	_, js := connect(t, url)
	w2, rec := startWatcher(t, js, kv.Config{StateDir: state, InitialTimeout: 300 * time.Millisecond})
	waitReady(t, w2)
	if w2.Source() != kv.SourceStateDir || w2.Snapshot().Models["old"] == nil {
		t.Fatalf("Source %q, models %v", w2.Source(), w2.Snapshot().Models)
	}
	if w.Unreachable() != 0 {
		t.Errorf("the watcher of a bucket in reach says it is out of reach for %v", w.Unreachable())
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, testkit.Cond("the bucket said out of reach", func() bool { return w2.Unreachable() > 0 }))

	// The bucket appears: the watcher switches to it, and keys that are
	// only in the persisted table go away.
	b, err := kv.EnsureBucket(ctxT(t), js, bucket, 1)
	if err != nil {
		t.Fatal(err)
	}
	put(t, b, "models.new", `{}`)
	snapshotHas(t, w2, "models.new", "{}")
	if w2.Source() != kv.SourceKV {
		t.Errorf("Source = %q after recovery", w2.Source())
	}
	if w2.Snapshot().Models["old"] != nil {
		t.Error("a key absent from the bucket survived recovery")
	}
	if d := w2.Unreachable(); d != 0 {
		t.Errorf("the bucket read again, and said out of reach for %v", d)
	}
	// OnSnapshot runs just after the swap: wait for it.
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		snaps := rec.snapshots()
		if len(snaps) < 2 || snaps[len(snaps)-1].Models["new"] == nil {
			return fmt.Errorf("%d snapshots reported", len(snaps))
		}
		return nil
	})
}

func TestNoStateAndNoBucketIsNotReady(t *testing.T) {
	_, url := natstest.Start(t)
	_, js := connect(t, url)
	w, _ := startWatcher(t, js, kv.Config{InitialTimeout: 100 * time.Millisecond, MinRetry: 20 * time.Millisecond})
	select {
	case <-w.Ready():
		t.Fatal("ready without any table")
	case <-time.After(500 * time.Millisecond):
	}
	if w.Snapshot() != nil || w.Source() != "" || w.Age() != 0 {
		t.Fatal("a snapshot without a table")
	}
	b, err := kv.EnsureBucket(ctxT(t), js, bucket, 1)
	if err != nil {
		t.Fatal(err)
	}
	put(t, b, "models.m", `{}`)
	waitReady(t, w)
	snapshotHas(t, w, "models.m", "{}")
}

func TestWatcherSurvivesAServerRestart(t *testing.T) {
	e := newEnv(t)
	put(t, e.kv, "models.before", `{}`)
	w, _ := startWatcher(t, e.js, kv.Config{})
	waitReady(t, w)
	snapshotHas(t, w, "models.before", "{}")

	natstest.Restart(t, e.srv)
	// While the watch recovers the last good table stays in force.
	if w.Snapshot().Models["before"] == nil {
		t.Fatal("table lost on restart")
	}
	testkit.CheckFor(t, 15*time.Second, 10*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := e.kv.PutString(ctx, "models.after", `{}`)
		return err
	})

	snapshotHas(t, w, "models.after", "{}")
}

func TestRunTwiceAndStopLeaveNoGoroutines(t *testing.T) {
	e := newEnv(t)
	testkit.NoGoroutinesLeft(t)
	w := kv.New(e.js, kv.Config{Bucket: bucket})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	<-w.Ready()
	if err := w.Run(ctx); !errors.Is(err, kv.ErrRunning) {
		t.Errorf("second Run: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
