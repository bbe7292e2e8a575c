// Package owners remembers which replica holds each stored response of the
// Responses API, in a JetStream KV bucket every broker reads: engines keep
// stored responses in one replica's memory, so a turn naming
// previous_response_id, and a GET or DELETE of a response, must reach that
// replica. The bucket's TTL and size bound what is remembered.
package owners

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/subjects"
)

// Defaults of the bucket.
const (
	DefaultBucket = subjects.ResponsesBucket
	// DefaultTTL is how long a response is remembered after its turn: a
	// conversation idle longer starts over.
	DefaultTTL = 24 * time.Hour
	// DefaultMaxBytes bounds the bucket; the oldest records go first.
	DefaultMaxBytes = 256 << 20
)

// ErrNotFound is a response the bucket does not remember.
var ErrNotFound = errors.New("owners: response not remembered")

// Record is what the bucket keeps per response id.
type Record struct {
	Tenant  string `json:"tenant"`
	Replica string `json:"replica"`
	Model   string `json:"model"`
	// Tokens bounds the conversation's length once this response is
	// added: the turn's prompt (stored context included) and the tokens
	// reserved for its answer. The engine puts that context before the
	// next turn's input, so brokers count it in that turn's prompt.
	Tokens int `json:"tokens"`
}

// Store reads and writes the bucket.
type Store struct {
	js     jetstream.JetStream
	bucket string
	create bool // create the bucket when missing (a writer); a reader finds nothing
	mu     sync.Mutex
	kv     jetstream.KeyValue // once opened
}

// New returns a writer's store on bucket (DefaultBucket when ""): the
// bucket is opened, or created, on first use.
func New(js jetstream.JetStream, bucket string) *Store {
	if bucket == "" {
		bucket = DefaultBucket
	}
	return &Store{js: js, bucket: bucket, create: true}
}

// NewReader returns a reader's store: it never creates the bucket, and
// finds nothing while it does not exist.
func NewReader(js jetstream.JetStream, bucket string) *Store {
	s := New(js, bucket)
	s.create = false
	return s
}

// Ensure creates the bucket when it does not exist.
func Ensure(ctx context.Context, js jetstream.JetStream, bucket string, replicas int) (jetstream.KeyValue, error) {
	if bucket == "" {
		bucket = DefaultBucket
	}
	kv, err := js.KeyValue(ctx, bucket)
	if err == nil {
		return kv, nil
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, err
	}
	// Create, never update: an adapter may create the bucket but not
	// change one an operator configured.
	kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: bucket, Description: "stored response id → owning replica",
		History: 1, TTL: DefaultTTL, MaxBytes: DefaultMaxBytes, Replicas: max(replicas, 1),
	})
	if errors.Is(err, jetstream.ErrBucketExists) {
		return js.KeyValue(ctx, bucket) // another writer created it first
	}
	return kv, err
}

func (s *Store) open(ctx context.Context) (jetstream.KeyValue, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kv != nil {
		return s.kv, nil
	}
	var kv jetstream.KeyValue
	var err error
	if s.create {
		kv, err = Ensure(ctx, s.js, s.bucket, 1)
	} else if kv, err = s.js.KeyValue(ctx, s.bucket); errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", s.bucket, err)
	}
	s.kv = kv
	return kv, nil
}

// Put remembers that id is held by r.Replica.
func (s *Store) Put(ctx context.Context, id string, r Record) error {
	kv, err := s.open(ctx)
	if err != nil {
		return err
	}
	b, _ := json.Marshal(r)
	_, err = kv.Put(ctx, id, b)
	return err
}

// Get returns the record of id, or ErrNotFound.
func (s *Store) Get(ctx context.Context, id string) (Record, error) {
	kv, err := s.open(ctx)
	if err != nil {
		return Record{}, err // ErrNotFound while a reader's bucket is missing
	}
	e, err := kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Record{}, ErrNotFound
	}
	if err != nil {
		return Record{}, err
	}
	var r Record
	if err := json.Unmarshal(e.Value(), &r); err != nil || r.Replica == "" {
		return Record{}, ErrNotFound
	}
	return r, nil
}

// Forget drops id (after a DELETE of the response).
func (s *Store) Forget(ctx context.Context, id string) error {
	kv, err := s.open(ctx)
	if err != nil {
		return err
	}
	return kv.Delete(ctx, id)
}
