package batch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// passTimeout bounds one supervision pass's reads and writes. A KV
// listing is a watch that ends only when its last key arrives: behind a
// NATS server that froze, or a stream whose leader moved, it can wait for
// ever, and with it the progress, the finalizing and the pullers of every
// batch.
const passTimeout = 15 * time.Second

// supervise looks over every batch once: it starts what a batch's status
// asks for and returns the tenants with lines to run, with how many of
// their batches are running; ok is false when it could not read the
// batches, and the pullers are then left as they are.
func (b *Batcher) supervise(ctx context.Context, wg *sync.WaitGroup) (active map[string]int, ok bool) {
	pass, cancel := context.WithTimeout(ctx, passTimeout)
	defer cancel()
	b.counts.flush(pass, b)
	recs, err := listRecords(pass, b.store.batches, "")
	if err != nil {
		if ctx.Err() == nil {
			b.log.Warn("list batches", "err", err)
		}
		return nil, false
	}
	active = map[string]int{}
	byStatus := map[string]int{}
	now := b.cfg.Now()
	for _, rec := range recs {
		byStatus[rec.Status]++
		switch rec.Status {
		case StatusValidating:
			active[rec.Tenant]++
			b.work(wg, rec.ID, func() { b.expand(ctx, rec) })
		case StatusInProgress:
			active[rec.Tenant]++
			switch {
			case rec.ExpiresAt != nil && now.Unix() >= *rec.ExpiresAt:
				b.work(wg, rec.ID, func() { b.finish(ctx, rec, StatusExpired) })
			case b.itemsLeft(pass, rec) == 0:
				b.work(wg, rec.ID, func() { b.finish(ctx, rec, StatusCompleted) })
			}
		case StatusCancelling:
			// The lines in flight at the cancel run to their end and go
			// into the files (OpenAI keeps a cancelled batch's partial
			// results); the others are taken off the stream unanswered
			// (process). The batch is finalized once no item is left,
			// which is once each line in flight has its result stored.
			active[rec.Tenant]++
			if b.itemsLeft(pass, rec) == 0 || b.drainedTooLong(rec, now) {
				b.work(wg, rec.ID, func() { b.finish(ctx, rec, StatusCancelled) })
			}
		case StatusFinalizing:
			b.work(wg, rec.ID, func() { b.finish(ctx, rec, rec.Ending) })
		}
	}
	b.metrics.setBatches(byStatus)
	return active, true
}

// itemsLeft is the number of rec's items still in the stream (-1 when it
// cannot tell): a work-queue stream drops an item when it is acknowledged,
// which is after its result is stored.
func (b *Batcher) itemsLeft(ctx context.Context, rec *Record) int {
	subject := b.subj.BatchItems(rec.Tenant, rec.ID)
	info, err := b.items.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return -1
	}
	return int(info.State.Subjects[subject])
}

// drainedTooLong reports whether a cancelling batch has waited for its
// lines in flight longer than one of them can run: what is left then (an
// item no batcher will take) is dropped by the finalizing.
func (b *Batcher) drainedTooLong(rec *Record, now time.Time) bool {
	return rec.CancellingAt != nil && now.Sub(time.Unix(*rec.CancellingAt, 0)) > b.cfg.RequestTimeout+b.cfg.AckWait
}

// expandTimeout bounds one expansion of a batch's input file into items.
const expandTimeout = 2 * time.Minute

// expand turns a validating batch's lines into items. Each item's message
// id is <batch>.<line>, so a second expansion (this batcher died half way)
// adds none twice within the stream's duplicate window, and a line whose
// result exists is skipped by whoever takes it anyway.
func (b *Batcher) expand(ctx context.Context, rec *Record) {
	rec = b.claim(ctx, rec, nil)
	if rec == nil {
		return
	}
	// The file is read through a consumer that a moving stream leader can
	// leave silent: an expansion that runs out of time is done again.
	ctx, cancel := context.WithTimeout(ctx, expandTimeout)
	defer cancel()
	var r jetstream.ObjectResult
	err := b.store.unlessStale(ctx, objectName(rec.Tenant, rec.InputFileID), func() (err error) {
		r, err = b.store.files.Get(ctx, objectName(rec.Tenant, rec.InputFileID))
		return err
	})
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		b.fail(ctx, rec, "file_not_found", "the input file "+rec.InputFileID+" could not be read: "+err.Error())
		return
	}
	if err != nil {
		if ctx.Err() == nil {
			b.log.Warn("expand: read the input", "batch", rec.ID, "err", err)
		}
		return // JetStream is away: the next supervision tries again
	}
	defer r.Close()
	subject := b.subj.BatchItems(rec.Tenant, rec.ID)
	var items int
	var acks []jetstream.PubAckFuture
	_, err = EachLine(r, func(n int, raw []byte) error {
		l, msg := ParseLine(raw)
		if msg != "" {
			return lineError(n, msg)
		}
		data, err := json.Marshal(Item{Line: n, CustomID: l.CustomID, Body: l.Body})
		if err != nil {
			return err
		}
		m := nats.NewMsg(subject)
		m.Data = data
		m.Header.Set(jetstream.MsgIDHeader, resultKey(rec.ID, n))
		ack, err := b.js.PublishMsgAsync(m)
		if err != nil {
			return err
		}
		acks = append(acks, ack)
		items++
		return nil
	})
	if err == nil {
		// Each item must be stored: one that is not would be a line the
		// batch never runs. The publishes time out (open), so a stream
		// leader that died holding some does not hold the expansion.
		select {
		case <-b.js.PublishAsyncComplete():
		case <-ctx.Done():
			return
		}
		for i, a := range acks {
			select {
			case <-a.Ok():
			case err = <-a.Err():
			}
			if err != nil {
				err = fmt.Errorf("item %d of %d: %w", i+1, len(acks), err)
				break
			}
		}
	}
	if err != nil {
		if ctx.Err() == nil {
			b.log.Warn("expand", "batch", rec.ID, "err", err)
		}
		return // the claim goes stale and another tries
	}
	now := b.cfg.Now()
	_, err = updateRecord(ctx, b.store.batches, rec.Tenant, rec.ID, func(r *Record) error {
		r.Owner, r.OwnedUnixMs = "", 0
		if r.Status == StatusValidating {
			r.Status, r.InProgressAt = StatusInProgress, unixPtr(now)
			r.RequestCounts.Total = items
		}
		return nil
	})
	if err != nil && ctx.Err() == nil {
		b.log.Warn("expand: record", "batch", rec.ID, "err", err)
	}
	b.log.Info("batch in progress", "batch", rec.ID, "tenant", rec.Tenant, "lines", items)
}

// fail ends a batch that cannot run, with OpenAI's errors list.
func (b *Batcher) fail(ctx context.Context, rec *Record, code, msg string) {
	now := b.cfg.Now()
	_, err := updateRecord(ctx, b.store.batches, rec.Tenant, rec.ID, func(r *Record) error {
		r.Status, r.FailedAt, r.Owner = StatusFailed, unixPtr(now), ""
		r.Errors = &Errors{Object: "list", Data: []LineError{{Code: code, Message: msg}}}
		return nil
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		b.log.Warn("fail batch", "batch", rec.ID, "err", err)
	}
}

// progress is the lines each batch answered since the last flush, written
// into the records by the supervisor: one update per batch and tick, not
// one per line. What a batcher dies holding is recounted at finalizing.
type progress struct {
	mu      sync.Mutex
	pending map[string]*delta
}

type delta struct {
	tenant, id        string
	completed, failed int
}

func (p *progress) add(tenant, id string, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pending == nil {
		p.pending = map[string]*delta{}
	}
	d := p.pending[id]
	if d == nil {
		d = &delta{tenant: tenant, id: id}
		p.pending[id] = d
	}
	if ok {
		d.completed++
	} else {
		d.failed++
	}
}

func (p *progress) flush(ctx context.Context, b *Batcher) {
	p.mu.Lock()
	pending := p.pending
	p.pending = nil
	p.mu.Unlock()
	for _, d := range pending {
		_, err := updateRecord(ctx, b.store.batches, d.tenant, d.id, func(r *Record) error {
			if r.Status != StatusInProgress && r.Status != StatusValidating {
				return ErrUnchanged
			}
			c := &r.RequestCounts
			c.Completed = min(c.Completed+d.completed, c.Total)
			c.Failed = min(c.Failed+d.failed, c.Total-c.Completed)
			return nil
		})
		if err != nil && !errors.Is(err, ErrNotFound) && ctx.Err() == nil {
			b.log.Warn("progress", "batch", d.id, "err", err)
		}
	}
}

// recordCache keeps the records items look up for a second: a batch's
// status and tenant, read once per batch and second, not once per line.
type recordCache struct {
	mu sync.Mutex
	m  map[string]cachedRecord
}

type cachedRecord struct {
	rec  *Record
	read time.Time
}

func (c *recordCache) get(ctx context.Context, b *Batcher, tenant, id string) (*Record, error) {
	key := recordKey(tenant, id)
	now := time.Now()
	c.mu.Lock()
	if e, ok := c.m[key]; ok && now.Sub(e.read) < time.Second {
		c.mu.Unlock()
		return e.rec, nil
	}
	c.mu.Unlock()
	rec, _, err := getRecord(ctx, b.store.batches, tenant, id)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) > 4096 {
		c.m = map[string]cachedRecord{}
	}
	c.m[key] = cachedRecord{rec: rec, read: now}
	c.mu.Unlock()
	return rec, nil
}
