package kv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// JetStream atomic batch publishing (nats-server 2.12+): every message of a
// batch carries its id and sequence, and the last one commits. The server
// stores all of them at once or none, so a watcher sees the whole batch
// pending behind its first message (Delta > 0) and publishes one snapshot.
const (
	hdrBatchID     = "Nats-Batch-Id"
	hdrBatchSeq    = "Nats-Batch-Sequence"
	hdrBatchCommit = "Nats-Batch-Commit"
	hdrExpectedSeq = "Nats-Expected-Last-Subject-Sequence"
	hdrKVOperation = "KV-Operation"

	// maxAtomicBatch is nats-server's default limit of messages per batch.
	maxAtomicBatch = 1000
	// batchAttempts bounds re-planning after a concurrent write.
	batchAttempts = 4
	// commitTimeout bounds the commit when ctx has no deadline.
	commitTimeout = 10 * time.Second
)

// Error codes of a batch that lost a compare-and-set: a wrong last
// sequence, or an abandoned batch (an earlier message failed its check).
const (
	errCodeWrongLastSeq      jetstream.ErrorCode = 10071
	errCodeWrongLastSeqConst jetstream.ErrorCode = 10164
	errCodeIncompleteBatch   jetstream.ErrorCode = 10176
)

func batchConflict(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case errCodeWrongLastSeq, errCodeWrongLastSeqConst, errCodeIncompleteBatch:
		return true
	}
	return false
}

// importAtomic imports flat as one batch. done is false when the bucket
// cannot take it, and the caller writes key by key instead.
func importAtomic(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, flat map[string]json.RawMessage, prune bool) (rep Report, done bool, err error) {
	s, err := js.Stream(ctx, streamPrefix+kv.Bucket())
	if err != nil || !s.CachedInfo().Config.AllowAtomicPublish {
		return Report{}, false, nil
	}
	pre := subjectPrefix + kv.Bucket() + "."
	for range batchAttempts {
		rep, msgs, err := planBatch(ctx, s, kv, pre, flat, prune)
		if err != nil {
			return Report{}, true, err
		}
		if len(msgs) > maxAtomicBatch {
			return Report{}, false, nil
		}
		if len(msgs) > 0 {
			err = publishBatch(ctx, js.Conn(), msgs)
			if batchConflict(err) {
				continue
			}
			if err != nil {
				return Report{}, true, fmt.Errorf("atomic import: %w", err)
			}
		}
		rep.Atomic = true
		return rep, true, nil
	}
	return Report{}, true, fmt.Errorf("%w: atomic import lost %d races", ErrConflict, batchAttempts)
}

// planBatch reads each key's last revision and builds the messages of the
// batch, each expecting the revision it was planned against.
func planBatch(ctx context.Context, s jetstream.Stream, kv jetstream.KeyValue, pre string, flat map[string]json.RawMessage, prune bool) (Report, []*nats.Msg, error) {
	var rep Report
	var msgs []*nats.Msg
	last := func(key string) (data []byte, exists bool, rev uint64, err error) {
		m, err := s.GetLastMsgForSubject(ctx, pre+key)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, false, 0, nil
		}
		if err != nil {
			return nil, false, 0, err
		}
		if op := m.Header.Get(hdrKVOperation); op != "" {
			return nil, false, m.Sequence, nil // a delete or purge marker
		}
		return m.Data, true, m.Sequence, nil
	}
	add := func(key string, data []byte, rev uint64) *nats.Msg {
		m := nats.NewMsg(pre + key)
		m.Data = data
		m.Header.Set(hdrExpectedSeq, strconv.FormatUint(rev, 10))
		msgs = append(msgs, m)
		return m
	}

	for _, k := range slices.Sorted(maps.Keys(flat)) {
		want := compact(flat[k])
		cur, exists, rev, err := last(k)
		if err != nil {
			return rep, nil, fmt.Errorf("reading %s: %w", k, err)
		}
		switch {
		case !exists:
			rep.Created = append(rep.Created, k)
		case string(compact(cur)) == string(want):
			rep.Unchanged = append(rep.Unchanged, k)
			continue
		default:
			rep.Updated = append(rep.Updated, k)
		}
		add(k, want, rev)
	}
	if prune {
		gone, err := pruned(ctx, kv, flat)
		if err != nil {
			return rep, nil, err
		}
		for _, k := range gone {
			_, exists, rev, err := last(k)
			if err != nil {
				return rep, nil, fmt.Errorf("reading %s: %w", k, err)
			}
			if !exists {
				continue
			}
			add(k, nil, rev).Header.Set(hdrKVOperation, "DEL")
			rep.Deleted = append(rep.Deleted, k)
		}
	}
	return rep, msgs, nil
}

// publishBatch sends msgs as one atomic batch and waits for the commit's
// acknowledgement. Only the commit asks for a reply: a failure earlier in the
// batch abandons it, and the commit then reports it incomplete.
func publishBatch(ctx context.Context, nc *nats.Conn, msgs []*nats.Msg) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, commitTimeout)
		defer cancel()
	}
	id := nuid.Next()
	n := len(msgs)
	for i, m := range msgs {
		m.Header.Set(hdrBatchID, id)
		m.Header.Set(hdrBatchSeq, strconv.Itoa(i+1))
		if i < n-1 {
			if err := nc.PublishMsg(m); err != nil {
				return err
			}
			continue
		}
		m.Header.Set(hdrBatchCommit, "1")
		resp, err := nc.RequestMsgWithContext(ctx, m)
		if err != nil {
			return err
		}
		var ack struct {
			Error *jetstream.APIError `json:"error"`
			Batch string              `json:"batch"`
			Count int                 `json:"count"`
		}
		if err := json.Unmarshal(resp.Data, &ack); err != nil {
			return fmt.Errorf("batch acknowledgement: %w", err)
		}
		if ack.Error != nil {
			return ack.Error
		}
		if ack.Batch != id || ack.Count != n {
			return fmt.Errorf("batch acknowledgement for %q with %d messages, want %q with %d", ack.Batch, ack.Count, id, n)
		}
	}
	return nil
}
