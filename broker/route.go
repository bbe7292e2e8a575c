package broker

import (
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/switchyard-llm/switchyard/decider"
	"github.com/switchyard-llm/switchyard/internal/stages"
	"github.com/switchyard-llm/switchyard/subjects"
	replyproto "github.com/switchyard-llm/switchyard/subjects/reply"
)

// route is the per-message hot path: headers in, one publish out.
func (b *Broker) route(r micro.Request) {
	b.dispatch(r.Subject(), r.Reply(), nats.Header(r.Headers()), r.Data())
}

// dispatch handles one message on the endpoint's goroutine: handle
// decides, send acts.
func (b *Broker) dispatch(subject, reply string, h nats.Header, data []byte) {
	defer b.handled.Add(1)
	if reply != "" && !b.subj.InReplySpace(reply) {
		// The routed notice and a rejection are published to the reply
		// subject: one outside the reply space (a JetStream API subject,
		// another part's subject) is an attack, not a client. Permissions
		// are the second line: a response allowance passes where a deny
		// matches.
		b.dec.RefuseReply(reply)
		return
	}
	if h == nil {
		h = nats.Header{}
	}
	s := b.dec.Get()
	b.cfg.Stages.Mark(b.stageID(h), stages.BrokerReceived)
	b.send(s, subject, reply, h, data, b.dec.Handle(s, subject, reply, h, data))
}

// send acts on what handle (or owned) decided, and is done with s: it
// publishes the routed notice and the request for the replica, or the
// refusal for the reply subject (to no one without one). An owner read is
// handed to lookUp with s, which sends what the owner decides.
func (b *Broker) send(s *decider.Scratch, subject, reply string, h nats.Header, data []byte, a decider.Action) {
	switch a.Do {
	case decider.DoReadOwner:
		b.lookUp(s, subject, reply, h, data, a.Owner)
		return
	case decider.DoForward:
		if reply != "" {
			// The routed notice goes first, so a gateway that hears no
			// accept knows which replica to exclude on its retry
			// (docs/architecture.md, "Decisions").
			// A gateway hears it on its routed subject, where only
			// brokers publish (subjects.RoutedFor).
			notice := replyproto.Frame{Kind: replyproto.Routed, Replica: a.Route.Replica, Header: s.NoticeHeader()}
			_ = b.nc.PublishMsg(notice.Msg(b.subj.RoutedFor(reply)))
		}
		if err := b.nc.PublishMsg(&a.Route.Msg); err != nil && reply != "" {
			var m nats.Msg
			b.dec.Reject(&m, reply, subjects.NewError(503, subjects.CodeRouterUnavailable, "broker could not forward: "+err.Error()))
			_ = b.nc.PublishMsg(&m)
		}
		b.cfg.Stages.Mark(b.stageID(h), stages.Forwarded)
	case decider.DoRefuse:
		if reply != "" {
			var m nats.Msg
			b.dec.Reject(&m, reply, a.Err)
			_ = b.nc.PublishMsg(&m)
		}
	}
	b.dec.Release(s)
}

// MaxOwnerLookups bounds the requests reading their stored response's
// owner at once (each holds its body, up to 8 MiB): past it such a request
// is answered 503 with Retry-After, never queued.
const MaxOwnerLookups = 64

// lookUp reads the owner of stored response id on a goroutine of its own,
// counted in b.lookups, so a slow read (a JetStream leader election) holds
// up that request only, not every request behind it on the endpoint's
// goroutine. Once the broker is stopping it reads here instead, so no
// lookup goroutine outlives stop.
func (b *Broker) lookUp(s *decider.Scratch, subject, reply string, h nats.Header, data []byte, id string) {
	b.lookMu.Lock()
	if b.stopping {
		b.lookMu.Unlock()
		b.send(s, subject, reply, h, data, b.dec.Owned(s, subject, reply, h, data, id))
		return
	}
	select {
	case b.lookups <- struct{}{}:
	default:
		b.lookMu.Unlock()
		e := subjects.NewError(503, subjects.CodeRouterUnavailable,
			"this broker is reading the owners of "+strconv.Itoa(MaxOwnerLookups)+" stored responses already; try again")
		e.RetryAfter = time.Second
		b.dec.Rejected(e.Code)
		b.send(s, subject, reply, h, data, decider.Action{Do: decider.DoRefuse, Err: e})
		return
	}
	b.lookupsRunning.Add(1)
	b.lookMu.Unlock()
	go func() {
		defer b.lookupsRunning.Done()
		defer func() { <-b.lookups }()
		b.send(s, subject, reply, h, data, b.dec.Owned(s, subject, reply, h, data, id))
	}()
}

// endLookups makes every later lookup finish where it arrives and waits
// for the ones running: after it, no lookup goroutine is left.
func (b *Broker) endLookups() {
	b.lookMu.Lock()
	b.stopping = true
	b.lookMu.Unlock()
	b.lookupsRunning.Wait()
}

// stageID is the request id the stage recorder knows the request by (""
// when it records nothing: no header lookup then).
func (b *Broker) stageID(h nats.Header) string {
	if b.cfg.Stages == nil {
		return ""
	}
	return h.Get(subjects.HdrRequestID)
}

// explain answers a dry run on llm.explain.<tenant> (decider.Explain).
func (b *Broker) explain(r micro.Request) {
	w, e := b.dec.Explain(r.Subject(), nats.Header(r.Headers()), r.Data())
	if e != nil {
		_ = r.Respond(e.Body())
		return
	}
	_ = r.RespondJSON(w)
}
