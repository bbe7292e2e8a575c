package kv_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/table/kv"
)

// TestARegionReadsItsCopyOfTheTable: on a supercluster of two regions, the
// bucket in a and region b's copy made by EnsureCopy, a watcher of region b
// reads the copy (its consumer is on the copy's stream, in b), keeps the
// table while the link is cut and says how long the primary has been out of
// reach, and takes the write made during the cut once the link heals.
func TestARegionReadsItsCopyOfTheTable(t *testing.T) {
	sc := natstest.TwoRegions(t, "a", "b")
	_, jsa := connect(t, sc.URL(0))
	_, jsb := connect(t, sc.URL(1))
	primary, err := kv.EnsureBucket(ctxT(t), jsa, bucket, 1)
	if err != nil {
		t.Fatal(err)
	}
	put(t, primary, "models.m", `{"tier":"hot"}`)
	cp, err := kv.EnsureCopy(ctxT(t), jsb, bucket, "b", 1)
	if err != nil {
		t.Fatal(err)
	}
	if c := cp.CachedInfo().Cluster; c == nil || c.Name != "b" {
		t.Fatalf("the copy is placed in %+v, want cluster b", c)
	}
	// Again: the copy is opened, not made twice.
	if _, err := kv.EnsureCopy(ctxT(t), jsa, bucket, "b", 1); err != nil {
		t.Fatalf("EnsureCopy of an existing copy: %v", err)
	}

	w, _ := startWatcher(t, jsb, kv.Config{Region: "b", CheckEvery: 200 * time.Millisecond})
	waitReady(t, w)
	snapshotHas(t, w, "models.m", `{"tier":"hot"}`)
	// A copy just made has not heard from the primary yet: the watcher
	// reads the primary until it has.
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		info, err := cp.Info(ctxT(t))
		if err != nil || info.State.Consumers != 1 {
			return fmt.Errorf("the copy's stream has consumers %v (%v), want the watcher's", info.State.Consumers, err)
		}
		return nil
	})
	if d := w.Unreachable(); d != 0 {
		t.Fatalf("the primary in reach, the watcher says out of reach for %v", d)
	}

	sc.Cut()
	cut := time.Now()
	put(t, primary, "models.m", `{"tier":"cold"}`)
	testkit.CheckFor(t, 3*kv.CopyQuiet, 50*time.Millisecond, testkit.Cond("the primary said out of reach", func() bool { return w.Unreachable() > 0 }))
	// Backdated to the copy's last word from the primary, about a second
	// before the cut.
	if d, since := w.Unreachable(), time.Since(cut); d > since+2*time.Second || d < kv.CopyQuiet-time.Second {
		t.Errorf("out of reach for %v, %v after the cut", d, since)
	}
	if got := string(w.Snapshot().Raw["models.m"]); got != `{"tier":"hot"}` {
		t.Errorf("during the cut the copy's table has %s", got)
	}

	sc.Heal()
	// Through the primary once the watcher reaches it again, or through the
	// copy once its mirror retries (JetStream backs those off after a cut:
	// up to a minute here); on a loaded two-core machine the first took
	// more than 10 s.
	snapshotHasWithin(t, 90*time.Second, w, "models.m", `{"tier":"cold"}`)
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, testkit.Cond("the primary in reach again", func() bool { return w.Unreachable() == 0 }))
	got := time.Since(cut)
	// Whether it read the write through the primary meanwhile or not, the
	// watcher ends on the copy (JetStream's mirror backs its retries off
	// after a cut: up to a minute here).
	back := testkit.CheckFor(t, 90*time.Second, 100*time.Millisecond, func() error {
		info, err := cp.Info(ctxT(t))
		if err != nil || info.State.Consumers != 1 {
			return fmt.Errorf("no watch on the copy (%v)", err)
		}
		return nil
	})
	t.Logf("the write made during the cut read %v after the cut; the watcher on the copy %v later", got.Round(time.Millisecond), back.Round(time.Millisecond))
}

// TestALaggingCopyGivesWayToTheBucket: a region's copy that does not hear
// from the bucket (here a mirror whose origin cannot be reached; after a
// long cut, JetStream's mirror backs off its retries for up to two minutes)
// gives way to the bucket while the bucket answers, and the watcher goes
// back to the copy once the copy hears from the bucket again.
func TestALaggingCopyGivesWayToTheBucket(t *testing.T) {
	e := newEnv(t)
	put(t, e.kv, "models.m", `{"tier":"hot"}`)
	mirror := func(api string) jetstream.KeyValue {
		src := &jetstream.StreamSource{Name: bucket}
		if api != "" {
			src.External = &jetstream.ExternalStream{APIPrefix: api}
		}
		b, err := e.js.CreateKeyValue(ctxT(t), jetstream.KeyValueConfig{Bucket: kv.CopyName(bucket, "b"), History: kv.History, Mirror: src})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	consumers := func(name string) int {
		s, err := e.js.Stream(ctxT(t), "KV_"+name)
		if err != nil {
			return -1
		}
		return s.CachedInfo().State.Consumers
	}
	mirror("$JS.nowhere.API")
	w, _ := startWatcher(t, e.js, kv.Config{Region: "b", CheckEvery: 100 * time.Millisecond})
	waitReady(t, w)
	snapshotHas(t, w, "models.m", `{"tier":"hot"}`)
	if n := consumers(kv.CopyName(bucket, "b")); n != 0 {
		t.Errorf("the copy's stream has %d consumers: the watcher reads a copy that never heard from the bucket", n)
	}
	if w.Unreachable() != 0 {
		t.Errorf("the bucket read, the watcher says it is out of reach for %v", w.Unreachable())
	}

	// The copy made again, hearing from the bucket: the watcher moves to it.
	if err := e.js.DeleteKeyValue(ctxT(t), kv.CopyName(bucket, "b")); err != nil {
		t.Fatal(err)
	}
	mirror("")
	took := testkit.CheckFor(t, 20*time.Second, 50*time.Millisecond, testkit.Cond("the watcher on the copy", func() bool {
		return consumers(kv.CopyName(bucket, "b")) == 1
	}))
	put(t, e.kv, "models.m", `{"tier":"cold"}`)
	snapshotHas(t, w, "models.m", `{"tier":"cold"}`)
	t.Logf("on the copy %v after it heard from the bucket", took.Round(time.Millisecond))
}

// TestACopyIsAMirrorOrRefused: a bucket of the copy's name that does not
// mirror the primary is refused by EnsureCopy and not read as the copy by a
// watcher; a watcher of a region with no copy reads the primary.
func TestACopyIsAMirrorOrRefused(t *testing.T) {
	e := newEnv(t)
	put(t, e.kv, "models.m", `{}`)
	w, _ := startWatcher(t, e.js, kv.Config{Region: "x"})
	waitReady(t, w)
	snapshotHas(t, w, "models.m", `{}`)

	// A mirror, but of another bucket.
	other, err := e.js.CreateKeyValue(ctxT(t), jetstream.KeyValueConfig{Bucket: "other"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Put(ctxT(t), "models.other", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.CreateKeyValue(ctxT(t), jetstream.KeyValueConfig{Bucket: kv.CopyName(bucket, "y"), Mirror: &jetstream.StreamSource{Name: "other"}}); err != nil {
		t.Fatal(err)
	}
	_, err = kv.EnsureCopy(context.Background(), e.js, bucket, "y", 1)
	if !errors.Is(err, kv.ErrNotACopy) {
		t.Fatalf("EnsureCopy over a bucket that is no mirror: %v, want ErrNotACopy", err)
	}
	wy, _ := startWatcher(t, e.js, kv.Config{Region: "y"})
	waitReady(t, wy)
	snapshotHas(t, wy, "models.m", `{}`)
	if raw := wy.Snapshot().Raw; len(raw) != 1 {
		t.Errorf("a watcher of region y read %v: the bucket's one key, not another bucket's mirror", raw)
	}
}
