package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/budget"
	"github.com/switchyard-llm/switchyard/subjects"
)

// ledger writes one record per request served on the LEDGER stream: the
// adapter is the part that knows what its engine served, and it outlives
// the decider that admitted the request. Records are published with an
// acknowledgement, retried, off the request path; a record whose tenant's
// request id is already on the stream is a duplicate the stream drops.
type ledger struct {
	js   jetstream.JetStream
	subj subjects.Subjects
	log  *slog.Logger
	now  func() time.Time
	ch   chan *nats.Msg
	// missing is set once a publish found no stream (LEDGER not created):
	// logged once.
	missing atomic.Bool
}

// ledgerQueue bounds the records waiting to be written.
const ledgerQueue = 4096

func newLedger(js jetstream.JetStream, subj subjects.Subjects, log *slog.Logger) *ledger {
	return &ledger{js: js, subj: subj, log: log, now: time.Now, ch: make(chan *nats.Msg, ledgerQueue)}
}

// record queues the record of a request served with t for tenant. A
// request that used nothing (refused, cancelled before it began) has
// none, so it cannot take the id of a retry that did the work.
func (l *ledger) record(h nats.Header, tenant, model string, t tokens) {
	if l == nil || (t.PromptTokens <= 0 && t.CompletionTokens <= 0) {
		return
	}
	id := h.Get(subjects.HdrClientRequestID)
	if id == "" {
		id = h.Get(subjects.HdrRequestID)
	}
	if id == "" {
		return
	}
	msgID := tenant + ":" + id
	resumed := h.Get(subjects.HdrResume) != ""
	if resumed {
		// A continuation is charged what its engine served, the re-prefill
		// of the prompt and the carried text included, in a record of its
		// own: the part before it was recorded by the replica that failed,
		// when it could, under the request's id.
		msgID += "#" + h.Get(subjects.HdrRequestID)
	}
	r := subjects.LedgerRecord{
		RequestID: id, Resumed: resumed, Tenant: tenant, Key: h.Get(subjects.HdrKeyID), Model: model,
		Version: h.Get(subjects.HdrRouteVersion), Pool: h.Get(subjects.HdrRoutePool), Replica: h.Get(subjects.HdrRouteReplica),
		PromptTokens: max(t.PromptTokens, 0), CachedTokens: max(t.Cached, 0), OutputTokens: max(t.CompletionTokens, 0),
		Priority: h.Get(subjects.HdrPriority), Decider: h.Get(subjects.HdrBroker), Time: l.now().UnixMilli(),
	}
	if p, ok := budget.ParsePriceHeader(h.Get(subjects.HdrPrice)); ok {
		c := p.Cost(r.PromptTokens, r.CachedTokens, r.OutputTokens, r.Priority == subjects.PriorityBatch)
		r.CostMicro, r.Cost = int64(c), c.Amount()
	}
	b, err := json.Marshal(&r)
	if err != nil {
		return
	}
	m := nats.NewMsg(l.subj.Ledger(tenant))
	m.Header.Set(jetstream.MsgIDHeader, msgID)
	m.Data = b
	select {
	case l.ch <- m:
	default:
		l.log.Warn("ledger queue full: record not written", "request", id)
	}
}

// run writes the queued records until ctx ends, then what is queued
// within drainWait, each tried once: a stopping adapter is not held up by
// a stream that does not answer.
func (l *ledger) run(ctx context.Context) {
	dctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	var deadline sync.WaitGroup
	defer deadline.Wait()
	deadline.Go(func() {
		// The drain's deadline begins when ctx ends.
		select {
		case <-ctx.Done():
			t := time.NewTimer(drainWait)
			defer t.Stop()
			select {
			case <-t.C:
				cancel()
			case <-dctx.Done():
			}
		case <-dctx.Done():
		}
	})
	// Several writers, each waiting for its record's acknowledgement, so
	// one round trip does not bound the records a second.
	var wg sync.WaitGroup
	for range ledgerWriters {
		wg.Go(func() { l.writer(ctx, dctx) })
	}
	wg.Wait()
	cancel() // the deadline's goroutine ends with it
}

// writer writes records until ctx ends, then what is queued until dctx
// ends.
func (l *ledger) writer(ctx, dctx context.Context) {
	for {
		select {
		case m := <-l.ch:
			l.write(ctx, m, ledgerTries)
		case <-ctx.Done():
			for {
				select {
				case m := <-l.ch:
					if dctx.Err() != nil {
						l.log.Warn("ledger record not written: the adapter stopped", "id", m.Header.Get(jetstream.MsgIDHeader))
						continue
					}
					l.write(dctx, m, 1)
				default:
					return
				}
			}
		}
	}
}

// ledgerTries bounds the publications of one record (over about 3 s), and
// drainWait what a stopping adapter spends on the records still queued.
const (
	ledgerTries   = 5
	ledgerWriters = 8
	drainWait     = 2 * time.Second
)

// write publishes one record, trying up to tries times. A stream that is
// not there is not waited for: the record is dropped at once, and said so
// once.
func (l *ledger) write(ctx context.Context, m *nats.Msg, tries int) {
	var err error
	for try := range tries {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = l.js.PublishMsg(pctx, m)
		cancel()
		if err == nil {
			l.missing.Store(false)
			return
		}
		if errors.Is(err, jetstream.ErrNoStreamResponse) {
			if !l.missing.Swap(true) {
				l.log.Warn("no LEDGER stream answers (switchyard table init creates it): records are not kept", "subject", m.Subject)
			}
			return
		}
		if ctx.Err() != nil || try == tries-1 {
			break
		}
		t := time.NewTimer(time.Duration(100<<try) * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	l.log.Warn("ledger record not written", "subject", m.Subject, "id", m.Header.Get(jetstream.MsgIDHeader), "err", err, "tries", strconv.Itoa(tries))
}
