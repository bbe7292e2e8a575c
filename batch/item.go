package batch

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/subjects"
	replyproto "github.com/switchyard-llm/switchyard/subjects/reply"
)

// maxHold bounds how long a refused line stays away: its Retry-After, at
// most this, before JetStream delivers it again.
const maxHold = 5 * time.Second

// replyIdle fails a line whose answer stays silent this long; adapters
// send a keepalive every 5 s while their engine works.
const replyIdle = 60 * time.Second

// answer is what one try of a line came back with.
type answer struct {
	status     int
	body       []byte
	retryAfter time.Duration
	err        error  // no complete answer (silence, a gap, a failure midway)
	from       string // where a refusal came from: one of refusedBy…
}

// Where a refusal (a 429 or a 503) came from, for
// switchyard_batch_refusals_total.
const (
	refusedByBroker  = "broker"  // an error from a broker: no room, a quota, no replica
	refusedByAdapter = "adapter" // an error naming the replica: its hold is full, it drains
	refusedByEngine  = "engine"  // the engine's own answer, passed on (its queue full)
	refusedByBus     = "bus"     // no broker listens, or the line could not be sent
)

// runnable returns the record of the batch msg belongs to when the line
// is to run. Otherwise it settles the item at once, without a slot of the
// window: a cancelled batch's items are taken off the stream as fast as
// they come, so that its finalizing waits only for the lines in flight.
func (b *Batcher) runnable(ctx context.Context, tenant string, msg jetstream.Msg) *Record {
	batchID := msg.Subject()[strings.LastIndexByte(msg.Subject(), '.')+1:]
	rec, err := b.records.get(ctx, b, tenant, batchID)
	if errors.Is(err, ErrNotFound) {
		// No record: nothing to answer it for, once the bucket's leader
		// says so. The read is a direct get, which a replica behind (a
		// server just restarted) can miss; dropping the item on its word
		// would lose the line.
		if has, known := b.store.leaderHasRecord(ctx, tenant, batchID); known && !has {
			_ = msg.Term()
		} else {
			_ = msg.NakWithDelay(time.Second)
		}
		return nil
	}
	if err != nil {
		_ = msg.NakWithDelay(time.Second)
		return nil
	}
	if rec.Status != StatusValidating && rec.Status != StatusInProgress {
		b.metrics.item(tenant, "skipped")
		_ = msg.Ack() // cancelled or over: the line does not run
		return nil
	}
	return rec
}

// process runs one item of rec's batch: skip it when its result exists,
// else send it, store the result and only then acknowledge it.
func (b *Batcher) process(ctx context.Context, tenant string, rec *Record, msg jetstream.Msg, s *slot) {
	var it Item
	if err := json.Unmarshal(msg.Data(), &it); err != nil || it.Line < 1 || it.Line > rec.Lines {
		_ = msg.Term()
		return
	}
	key := resultKey(rec.ID, it.Line)
	if _, err := b.results.Get(ctx, key); err == nil {
		b.metrics.item(tenant, "duplicate")
		_ = msg.Ack() // answered before this delivery: once is enough
		return
	}
	stop := b.keepInProgress(msg)
	a := b.send(ctx, rec, &it, func(replica string) { b.adm.accepted(s, replica) })
	stop()
	if ctx.Err() != nil {
		return // stopping: JetStream gives the item to another batcher
	}
	attempts := uint64(1)
	if md, err := msg.Metadata(); err == nil {
		attempts = md.NumDelivered
	}
	var ok bool
	var line []byte
	switch {
	case a.err == nil && (a.status == http.StatusTooManyRequests || a.status == http.StatusServiceUnavailable) &&
		errorCode(a.body) != subjects.CodeBudgetExceeded:
		// A refusal paces the batch; it is never a failed line. The line
		// leaves the window now (its caller releases it) and comes back
		// after its Retry-After; the window shrank to the lines the pool
		// holds, so its place starts no line the pool would refuse.
		b.adm.refused(tenant, a.status, a.retryAfter)
		b.metrics.item(tenant, "paced")
		b.metrics.refusal(a, errorCode(a.body))
		_ = msg.NakWithDelay(min(max(a.retryAfter, 100*time.Millisecond), maxHold))
		return
	case (a.err != nil || a.status == 500 || a.status == 502 || a.status == 504) && attempts < maxAttempts:
		b.metrics.item(tenant, "retried")
		_ = msg.NakWithDelay(time.Duration(attempts) * time.Second)
		return
	case a.err != nil:
		line = b.outputLine(rec, &it, http.StatusBadGateway, subjects.NewError(502, subjects.CodeUpstreamError, a.err.Error()).Body())
	default:
		// A line over its tenant's budget is a line error, and the batch
		// goes on: waiting would hold it until the budget's period ends.
		ok = a.status < 400
		line = b.outputLine(rec, &it, a.status, a.body)
	}
	if ok {
		line = append([]byte{kindOutput}, line...)
	} else {
		line = append([]byte{kindError}, line...)
	}
	if _, err := b.results.Create(ctx, key, line); err != nil && !conflict(err) {
		b.log.Warn("store result", "batch", rec.ID, "line", it.Line, "err", err)
		_ = msg.NakWithDelay(time.Second)
		return
	} else if err != nil {
		b.metrics.item(tenant, "duplicate") // another delivery stored it first
	} else {
		b.counts.add(tenant, rec.ID, ok)
		b.metrics.item(tenant, map[bool]string{true: "completed", false: "failed"}[ok])
	}
	b.adm.answered()
	if err := msg.DoubleAck(ctx); err != nil && ctx.Err() == nil {
		b.log.Debug("ack", "batch", rec.ID, "line", it.Line, "err", err)
	}
}

// outputLine is the line's entry in the output or error file.
func (b *Batcher) outputLine(rec *Record, it *Item, status int, body []byte) []byte {
	if !json.Valid(body) {
		body, _ = json.Marshal(string(body))
	}
	id := requestID(rec.ID, it.Line)
	line, _ := json.Marshal(OutputLine{ID: id, CustomID: it.CustomID,
		Response: &LineResponse{StatusCode: status, RequestID: id, Body: body}})
	return line
}

// keepInProgress tells JetStream the item is still being worked on, so a
// long answer is not delivered again while it runs; stop ends it.
func (b *Batcher) keepInProgress(msg jetstream.Msg) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(b.cfg.AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	}()
	return func() { close(done); <-finished }
}

// send sends one line on llm.batch.<tenant>, the tenant being the
// record's, and reads the reply protocol (docs/protocol.md) to its end
// with its one codec; onAccept is called with the replica that accepts it.
func (b *Batcher) send(ctx context.Context, rec *Record, it *Item, onAccept func(replica string)) answer {
	inbox := nats.NewInbox()
	sub, err := b.nc.SubscribeSync(inbox)
	if err != nil {
		return answer{err: err}
	}
	defer func() { _ = sub.Unsubscribe() }()
	deadline := b.cfg.Now().Add(b.cfg.RequestTimeout)
	if rec.ExpiresAt != nil {
		if exp := time.Unix(*rec.ExpiresAt, 0); exp.Before(deadline) {
			deadline = exp
		}
	}
	m := nats.NewMsg(b.subj.Batch(rec.Tenant))
	m.Reply, m.Data = inbox, it.Body
	m.Header.Set(subjects.HdrEndpoint, rec.Endpoint)
	m.Header.Set(subjects.HdrDeadline, strconv.FormatInt(deadline.UnixMilli(), 10))
	m.Header.Set(subjects.HdrClientRequestID, requestID(rec.ID, it.Line))
	if rec.KeyHash != "" {
		m.Header.Set(subjects.HdrKey, rec.KeyHash)
	}
	if err := b.nc.PublishMsg(m); err != nil {
		return answer{status: 503, retryAfter: time.Second, from: refusedByBus}
	}
	var a answer
	var seq replyproto.Sequence
	maxBody := int(b.nc.MaxPayload()) - 4096
	for {
		mctx, cancel := context.WithTimeout(ctx, replyIdle)
		r, err := sub.NextMsgWithContext(mctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return answer{err: ctx.Err()}
			}
			return answer{err: errors.New("no answer for " + replyIdle.String())}
		}
		f := replyproto.Decode(r)
		if f.Replica != "" && f.Kind != replyproto.Present {
			onAccept(f.Replica)
		}
		switch f.Kind {
		case replyproto.NoResponders:
			return answer{status: 503, retryAfter: time.Second, from: refusedByBus} // no broker listens
		case replyproto.Routed, replyproto.Keepalive, replyproto.Present:
			continue
		case replyproto.Accept:
			if !seq.Accepted() {
				seq.Accept()
				continue
			}
		case replyproto.Head:
			if f.Replica != "" && !seq.Accepted() {
				seq.Accept() // the accept rode on the head
			}
		case replyproto.Error:
			// An adapter's rejection names its replica (it tells the
			// gateway to try another); a broker's names none.
			from := refusedByBroker
			if r.Header.Get(subjects.HdrRouteReplica) != "" {
				from = refusedByAdapter
			}
			return answer{status: f.Status, body: f.Body, retryAfter: retryAfter(r.Header), from: from}
		case replyproto.Unknown, replyproto.Handover:
			return answer{err: errors.New("the answer broke off (" + f.Kind.String() + ")")}
		}
		if !seq.Next(&f) {
			return answer{err: errors.New("the answer lost a message")}
		}
		if f.Kind == replyproto.Head {
			a.status, a.from = f.Status, refusedByEngine
		}
		a.body = append(a.body, f.Body...)
		if len(a.body) > maxBody {
			return answer{status: 502, body: subjects.NewError(502, subjects.CodeUpstreamError,
				"the answer is over "+strconv.Itoa(maxBody)+" bytes, more than a result can hold").Body()}
		}
		if f.End {
			if f.Err != "" {
				return answer{err: errors.New(f.Err)}
			}
			if a.status == 0 {
				return answer{err: errors.New("the answer ended without a status")}
			}
			return a
		}
	}
}

func retryAfter(h nats.Header) time.Duration {
	if v := h.Get(subjects.HdrRetryAfterMS); v != "" {
		if ms, err := strconv.Atoi(v); err == nil && ms >= 0 {
			return min(time.Duration(ms)*time.Millisecond, time.Minute)
		}
	}
	if v := h.Get(subjects.HdrRetryAfter); v != "" {
		if s, err := strconv.Atoi(v); err == nil && s >= 0 {
			return min(time.Duration(s)*time.Second, time.Minute)
		}
	}
	return time.Second
}
