package kv

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/subjects"
)

// History is how many values of each key the bucket keeps
// (docs/protocol.md, "Routing table"), for `switchyard table history` and `rollback`.
const History = 16

// Stream and subject names JetStream derives from a bucket name.
const (
	streamPrefix  = "KV_"
	subjectPrefix = "$KV."
)

// EnsureBucket opens bucket, creating it with History values per key and the
// given number of replicas when it is absent. It also turns on atomic batch
// publishing on the bucket's stream, which Import uses (when the server is
// too old for it, Import falls back to writing key by key). It returns once
// the bucket answers a read (readable).
func EnsureBucket(ctx context.Context, js jetstream.JetStream, bucket string, replicas int) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      bucket,
			Description: "Switchyard routing table",
			History:     History,
			Replicas:    replicas,
			Storage:     jetstream.FileStorage,
		})
		if errors.Is(err, jetstream.ErrBucketExists) { // created by a peer meanwhile
			kv, err = js.KeyValue(ctx, bucket)
		}
	}
	if err != nil {
		return nil, err
	}
	allowAtomic(ctx, js, bucket)
	if err := readable(ctx, kv); err != nil {
		return nil, fmt.Errorf("bucket %s: %w", bucket, err)
	}
	return kv, nil
}

// readTimeout bounds how long readable waits for a bucket to answer.
const readTimeout = 10 * time.Second

// readable waits until the bucket answers a read. Just after its stream is
// created or its configuration updated, the stream's replicas set up the
// direct-get subscriptions that reads go to a moment later; a read in
// between finds no responders. `switchyard table init` is usually followed
// at once by `table import`, whose first read must not land in that gap.
func readable(ctx context.Context, kv jetstream.KeyValue) error {
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("no answer to a read within %s: %w", readTimeout, context.Cause(ctx))
		case <-retry.C:
		}
		_, err := kv.Get(ctx, "policy")
		if err == nil || errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil
		}
		if !errors.Is(err, nats.ErrNoResponders) {
			return err
		}
		retry.Reset(50 * time.Millisecond)
	}
}

// allowAtomic sets AllowAtomicPublish on the bucket's stream. It is best
// effort: without it imports are written key by key.
func allowAtomic(ctx context.Context, js jetstream.JetStream, bucket string) {
	s, err := js.Stream(ctx, streamPrefix+bucket)
	if err != nil {
		return
	}
	cfg := s.CachedInfo().Config
	if cfg.AllowAtomicPublish {
		return
	}
	cfg.AllowAtomicPublish = true
	_, _ = js.UpdateStream(ctx, cfg)
}

// CopyName is the bucket that holds region's copy of bucket
// (subjects.TableCopy).
func CopyName(bucket, region string) string { return subjects.TableCopy(bucket, region) }

// CopyQuiet is how long a region's copy may go without hearing from the
// primary bucket before the primary counts as out of reach. JetStream's
// mirror hears from its origin about once a second while the link holds,
// messages or not.
const CopyQuiet = 5 * time.Second

// ErrNotACopy is returned by EnsureCopy when a bucket of the copy's name
// exists but is not a mirror of the primary.
var ErrNotACopy = errors.New("the bucket exists but does not mirror the routing table's")

// EnsureCopy opens region's copy of bucket (CopyName), creating it when it
// is absent: a JetStream mirror of bucket placed in the NATS cluster named
// region (each region of a supercluster is a cluster named after it), so the
// region's deciders read the routing table from their own region and keep
// it while the link to the primary is down. Writes go to the primary; the
// mirror follows it.
func EnsureCopy(ctx context.Context, js jetstream.JetStream, bucket, region string, replicas int) (jetstream.Stream, error) {
	name := CopyName(bucket, region)
	s, err := js.Stream(ctx, streamPrefix+name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		_, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      name,
			Description: "Switchyard routing table, region " + region + "'s copy",
			History:     History,
			Replicas:    replicas,
			Storage:     jetstream.FileStorage,
			Mirror:      &jetstream.StreamSource{Name: bucket},
			Placement:   &jetstream.Placement{Cluster: region},
		})
		if err != nil && !errors.Is(err, jetstream.ErrBucketExists) {
			return nil, err
		}
		s, err = js.Stream(ctx, streamPrefix+name)
	}
	if err != nil {
		return nil, err
	}
	if m := s.CachedInfo().Config.Mirror; m == nil || m.Name != streamPrefix+bucket {
		return nil, fmt.Errorf("bucket %s: %w %s", name, ErrNotACopy, bucket)
	}
	return s, nil
}
