package kv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/table"
)

// Report says what an Import did, key by key (each list sorted).
type Report struct {
	Created   []string
	Updated   []string
	Unchanged []string
	Deleted   []string // only with Prune
	// Atomic is true when every change was committed as one atomic batch.
	Atomic bool
}

// String summarises the report in one line, as `switchyard table import`
// prints it.
func (r Report) String() string {
	s := fmt.Sprintf("created %d, updated %d, unchanged %d", len(r.Created), len(r.Updated), len(r.Unchanged))
	if len(r.Deleted) > 0 {
		s += fmt.Sprintf(", deleted %d", len(r.Deleted))
	}
	if r.Atomic {
		s += " (one atomic batch)"
	}
	return s
}

// ImportOption changes how Import writes.
type ImportOption func(*importConfig)

type importConfig struct {
	js    jetstream.JetStream
	prune bool
}

// Atomic commits all changes of an import as one JetStream atomic batch, so
// no reader ever sees half of them. It needs the bucket's stream to allow
// atomic publishing (EnsureBucket turns it on); otherwise, or past the
// server's batch limit, Import writes key by key.
func Atomic(js jetstream.JetStream) ImportOption {
	return func(c *importConfig) { c.js = js }
}

// Prune also deletes keys that flat does not have, except replicas.*, which
// the adapters own.
func Prune() ImportOption {
	return func(c *importConfig) { c.prune = true }
}

// Validate decodes and validates every value of a flat table. The error
// joins one table.KeyError per bad value (errors.Is(err, table.ErrInvalid)).
func Validate(flat map[string]json.RawMessage) error {
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(flat)) {
		if _, err := table.Decode(k, flat[k]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func compact(raw []byte) []byte {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return raw
	}
	return b.Bytes()
}

// Seed creates the keys of flat that the bucket does not have, leaving every
// existing key alone, and returns the keys it created. Any invalid value
// fails the seed before anything is written.
func Seed(ctx context.Context, kv jetstream.KeyValue, flat map[string]json.RawMessage) (created []string, err error) {
	if err := Validate(flat); err != nil {
		return nil, err
	}
	for _, k := range slices.Sorted(maps.Keys(flat)) {
		_, err := kv.Create(ctx, k, compact(flat[k]))
		if errors.Is(err, jetstream.ErrKeyExists) {
			continue
		}
		if err != nil {
			return created, fmt.Errorf("seeding %s: %w", k, err)
		}
		created = append(created, k)
	}
	return created, nil
}

// Export returns every key of the bucket with its current value, as stored
// (not validated): the flat format `switchyard table import` reads.
func Export(ctx context.Context, kv jetstream.KeyValue) (map[string]json.RawMessage, error) {
	flat := map[string]json.RawMessage{}
	err := Current(ctx, kv, ">", func(e jetstream.KeyValueEntry) error {
		flat[e.Key()] = json.RawMessage(slices.Clone(e.Value()))
		return nil
	})
	if err != nil {
		return nil, err
	}
	return flat, nil
}

// Current calls each for every key matching filter (a subject filter
// such as "keys.>") with its current value, deleted keys left out, and
// stops at the first error each returns.
func Current(ctx context.Context, kv jetstream.KeyValue, filter string, each func(jetstream.KeyValueEntry) error) error {
	w, err := kv.Watch(ctx, filter, jetstream.IgnoreDeletes())
	if err != nil {
		return err
	}
	defer drain(w)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return errWatchClosed
			}
			if e == nil { // every current entry has been delivered
				return nil
			}
			if err := each(e); err != nil {
				return err
			}
		}
	}
}

// Import writes a flat table into the bucket. Every value is validated first:
// any invalid value fails the import and nothing is written. New keys are
// created and changed keys updated with compare-and-set on the revision read;
// keys whose value is already equal are left alone. Keys absent from flat are
// kept unless Prune is given.
func Import(ctx context.Context, kv jetstream.KeyValue, flat map[string]json.RawMessage, opts ...ImportOption) (Report, error) {
	var cfg importConfig
	for _, o := range opts {
		o(&cfg)
	}
	if err := Validate(flat); err != nil {
		return Report{}, err
	}
	if cfg.js != nil {
		rep, done, err := importAtomic(ctx, cfg.js, kv, flat, cfg.prune)
		if done || err != nil {
			return rep, err
		}
	}
	return importByKey(ctx, kv, flat, cfg.prune)
}

// pruned lists the bucket's keys that an import with Prune deletes.
func pruned(ctx context.Context, kv jetstream.KeyValue, flat map[string]json.RawMessage) ([]string, error) {
	keys, err := kv.Keys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, k := range keys {
		if _, ok := flat[k]; !ok && !strings.HasPrefix(k, table.PrefixReplicas) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out, nil
}

// importByKey writes each key with its own compare-and-set, re-reading a key
// whose revision moved meanwhile.
func importByKey(ctx context.Context, kv jetstream.KeyValue, flat map[string]json.RawMessage, prune bool) (Report, error) {
	var rep Report
	for _, k := range slices.Sorted(maps.Keys(flat)) {
		want := compact(flat[k])
		outcome, err := putKey(ctx, kv, k, want)
		if err != nil {
			return rep, fmt.Errorf("importing %s: %w", k, err)
		}
		switch outcome {
		case created:
			rep.Created = append(rep.Created, k)
		case updated:
			rep.Updated = append(rep.Updated, k)
		default:
			rep.Unchanged = append(rep.Unchanged, k)
		}
	}
	if prune {
		gone, err := pruned(ctx, kv, flat)
		if err != nil {
			return rep, err
		}
		for _, k := range gone {
			if err := kv.Delete(ctx, k); err != nil {
				return rep, fmt.Errorf("pruning %s: %w", k, err)
			}
			rep.Deleted = append(rep.Deleted, k)
		}
	}
	return rep, nil
}

type outcome int

const (
	unchanged outcome = iota
	created
	updated
)

func putKey(ctx context.Context, kv jetstream.KeyValue, key string, want []byte) (outcome, error) {
	for attempt := range casAttempts {
		if err := casPause(ctx, attempt); err != nil {
			return unchanged, err
		}
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			_, err = kv.Create(ctx, key, want)
			if isConflict(err) {
				continue
			}
			return created, err
		}
		if err != nil {
			return unchanged, err
		}
		if bytes.Equal(compact(e.Value()), want) {
			return unchanged, nil
		}
		_, err = kv.Update(ctx, key, want, e.Revision())
		if isConflict(err) {
			continue
		}
		return updated, err
	}
	return unchanged, fmt.Errorf("%w: %s", ErrConflict, key)
}

// errWatchClosed reports a watch that the client library closed.
var errWatchClosed = errors.New("routing table watch closed")

// drain stops a watch and empties its channel until the library closes it:
// the library blocks on a full channel, and would otherwise never finish.
func drain(kw jetstream.KeyWatcher) {
	_ = kw.Stop()
	t := time.NewTimer(time.Second)
	defer t.Stop()
	for {
		select {
		case _, ok := <-kw.Updates():
			if !ok {
				return
			}
		case <-t.C:
			return
		}
	}
}
