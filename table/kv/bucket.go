package kv

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"
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
// too old for it, Import falls back to writing key by key).
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
	return kv, nil
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
