package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"strings"
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

	mu sync.Mutex
	// held is the records of unfinished parts waiting for the gateway's
	// word (by attempt id); nil once the adapter stops.
	held map[string]*heldRecord
	// early is the attempts resumed before their record was made.
	early map[string]time.Time
}

// ledgerQueue bounds the records waiting to be written.
const ledgerQueue = 4096

func newLedger(js jetstream.JetStream, subj subjects.Subjects, log *slog.Logger) *ledger {
	return &ledger{js: js, subj: subj, log: log, now: time.Now, ch: make(chan *nats.Msg, ledgerQueue), held: map[string]*heldRecord{}, early: map[string]time.Time{}}
}

// record queues the record of a request served with t for tenant. A
// request that used nothing (refused, cancelled before it began) has
// none, so it cannot take the id of a retry that did the work.
//
// A client request is one record, under its tenant and its client id
// (Nats-Msg-Id), whatever replicas served it. A continuation's record
// holds the whole request: what its engine served (the re-prefill of the
// prompt and the carried text counted as prompt, as the engine counted
// it) and the parts before it as the gateway counted them (Llm-Resume-
// Tokens, and the prompt without them). So that the record of a part that
// ended unfinished does not take the id first, it waits resumeWait for
// the gateway's word that the answer continues elsewhere (resumed), and
// is dropped on it.
func (l *ledger) record(h nats.Header, tenant, model string, t tokens, unfinished bool) {
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
	resumed := h.Get(subjects.HdrResume) != ""
	r := subjects.LedgerRecord{
		RequestID: id, Resumed: resumed, Tenant: tenant, Key: h.Get(subjects.HdrKeyID), Model: model,
		Version: h.Get(subjects.HdrRouteVersion), Pool: h.Get(subjects.HdrRoutePool), Replica: h.Get(subjects.HdrRouteReplica),
		PromptTokens: max(t.PromptTokens, 0), CachedTokens: max(t.Cached, 0), OutputTokens: max(t.CompletionTokens, 0),
		Priority: h.Get(subjects.HdrPriority), Decider: h.Get(subjects.HdrBroker), Time: l.now().UnixMilli(),
	}
	for i, v := range h.Values(subjects.HdrBudgetHold) {
		holder, key, ok := strings.Cut(v, " ")
		if !ok || i >= len(r.Budgets) || len(v) > 2*maxBudgetName || (r.Holder != "" && holder != r.Holder) {
			break
		}
		r.Holder, r.Budgets[i] = holder, key
	}
	if resumed {
		prompt, output := before(h)
		r.PromptTokens += prompt
		r.OutputTokens += output
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
	m.Header.Set(jetstream.MsgIDHeader, tenant+":"+id)
	m.Data = b
	if attempt := h.Get(subjects.HdrRequestID); unfinished && attempt != "" && l.hold(attempt, m) {
		return
	}
	l.queue(m)
}

// maxBudgetName bounds a lease holder and a budget's key copied into a
// record.
const maxBudgetName = 256

// maxCarriedTokens bounds the completion tokens a continuation says the
// parts before it served: the gateway carries at most 256 KiB of text.
const maxCarriedTokens = 256 << 10

// before is what the parts of a request before its continuation h served,
// as the gateway counted them: the prompt (the continuation's prompt
// estimate without the carried tokens) and the carried completion tokens.
// Values out of range count as nothing.
func before(h nats.Header) (prompt, output int) {
	output, err := strconv.Atoi(h.Get(subjects.HdrResumeTokens))
	if err != nil || output < 0 || output > maxCarriedTokens {
		return 0, 0
	}
	all, err := strconv.Atoi(h.Get(subjects.HdrPromptTokens))
	if err != nil || all < output || all-output > maxPromptTokens {
		return 0, output
	}
	return all - output, output
}

func (l *ledger) queue(m *nats.Msg) {
	select {
	case l.ch <- m:
	default:
		l.log.Warn("ledger queue full: record not written", "id", m.Header.Get(jetstream.MsgIDHeader))
	}
}

// resumeWait is how long the record of a part that ended unfinished waits
// for the gateway's word that the answer continues elsewhere; heldMax
// bounds the records waiting.
const (
	resumeWait = 500 * time.Millisecond
	heldMax    = 4096
)

// hold keeps m, the record of attempt's unfinished part, for resumeWait
// before queueing it; false when too many wait (m is queued at once).
func (l *ledger) hold(attempt string, m *nats.Msg) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.early[attempt]; ok {
		delete(l.early, attempt)
		return true // resumed already: the word came before the record
	}
	if l.held == nil || len(l.held) >= heldMax {
		return false
	}
	hr := &heldRecord{m: m}
	hr.t = time.AfterFunc(resumeWait, func() {
		l.mu.Lock()
		ok := l.held[attempt] == hr
		if ok {
			delete(l.held, attempt)
		}
		l.mu.Unlock()
		if ok {
			l.queue(m)
		}
	})
	l.held[attempt] = hr
	return true
}

type heldRecord struct {
	t *time.Timer
	m *nats.Msg
}

// resumed drops the held record of attempt: the gateway continues its
// answer on another replica, whose record holds this part too.
func (l *ledger) resumed(attempt string) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if hr, ok := l.held[attempt]; ok {
		hr.t.Stop()
		delete(l.held, attempt)
		return
	}
	// The word may come before the record of the part is made.
	now := l.now()
	if len(l.early) >= heldMax {
		for k, at := range l.early {
			if now.Sub(at) > resumeWait || len(l.early) >= heldMax {
				delete(l.early, k)
			}
		}
	}
	l.early[attempt] = now
}

// release queues every held record at once, and holds none after: the
// adapter is stopping.
func (l *ledger) release() {
	l.mu.Lock()
	var ms []*nats.Msg
	for _, hr := range l.held {
		hr.t.Stop()
		ms = append(ms, hr.m)
	}
	l.held = nil
	l.mu.Unlock()
	for _, m := range ms {
		l.queue(m)
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
			l.release()
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
