package adapter

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/switchyard-llm/switchyard/internal/stages"
	"github.com/switchyard-llm/switchyard/internal/telemetry"
	"github.com/switchyard-llm/switchyard/subjects"
	replyproto "github.com/switchyard-llm/switchyard/subjects/reply"
)

// maxErrorBody bounds an engine error body read for translation.
const maxErrorBody = 64 << 10

// onRequest is the micro handler. micro runs it one message at a time, so it
// only books the request and hands it to its own goroutine.
func (a *Adapter) onRequest(r micro.Request) {
	h := nats.Header(r.Headers())
	reply := r.Reply()
	if reply == "" {
		// A direct tenant's reply comes in Llm-Reply (see subjects.HdrReply).
		reply = h.Get(subjects.HdrReply)
	}
	if !a.subj.InReplySpace(reply) {
		a.log.Warn("request without a reply subject in the reply space dropped", "reply", reply)
		return
	}
	id := h.Get(subjects.HdrRequestID)
	a.cfg.Stages.Mark(id, stages.AdapterReceived)
	if a.noRoomForBatch(h) {
		a.reject(reply, h, &subjects.APIError{Status: http.StatusServiceUnavailable, Code: subjects.CodeAllReplicasBusy,
			Message: "replica " + a.cfg.Replica + " has no room for batch work; retry later.", RetryAfter: time.Second})
		return
	}
	ctx, c, took := a.book.take(id)
	switch took {
	case takenNot:
		a.reject(reply, h, &subjects.APIError{Status: http.StatusServiceUnavailable, Code: subjects.CodeNoReplicas,
			Message: "replica " + a.cfg.Replica + " is draining", RetryAfter: time.Second})
		return
	case takenGone:
		// Cancelled before it arrived: the gateway has given up on it
		// (or took another copy of it). Nothing was used: the broker
		// that admitted it gets its token reservation back.
		a.publishUsage(h, tokens{}, false)
		return
	case takenAlready:
		// The same request again: a gateway that saw no accept in time
		// sent it once more, in case the first was lost on the way. This
		// one is already served.
		a.log.Debug("request already in hand dropped", "id", id)
		return
	}
	a.metrics.inflight.Set(float64(a.book.inflight.Add(1)))
	a.loadChanged()
	if a.kv != nil {
		a.kv.learn(h.Get(subjects.HdrEndpoint), h.Get(subjects.HdrPrefix), r.Data())
	}
	go a.serve(ctx, c, id, reply, h, r.Data())
}

// onCancel cancels the engine call of the request named by Llm-Request-Id.
// One that names none, with a reply subject, is a gateway's probe: when it
// asks (Llm-Probe), it is answered present, there being something
// listening here.
func (a *Adapter) onCancel(r micro.Request) {
	id := r.Headers().Get(subjects.HdrRequestID)
	if id == "" {
		if reply := r.Reply(); reply != "" && r.Headers().Get(subjects.HdrProbe) != "" && a.subj.InReplySpace(reply) {
			f := replyproto.Frame{Kind: replyproto.Present, Replica: a.cfg.Replica}
			_ = a.nc.PublishMsg(f.Msg(reply))
		}
		return
	}
	if r.Headers().Get(subjects.HdrResume) != "" {
		// Not a cancel: the gateway continues the request's answer
		// elsewhere, and the continuation's record will hold this part.
		a.ledger.resumed(id)
		return
	}
	a.book.cancel(id, time.Now())
}

func (a *Adapter) done(c *call, id string) {
	a.book.forget(c, id)
	a.metrics.inflight.Set(float64(a.book.inflight.Add(-1)))
	a.loadChanged()
	a.book.release()
}

// reject answers with a single rejection message (seq 0, status, end).
func (a *Adapter) reject(reply string, h nats.Header, e *subjects.APIError) {
	f := replyproto.Rejection(e)
	// Naming the replica tells the gateway a replica (not a broker) turned
	// the request away, so it retries elsewhere with this one excluded.
	f.Header[subjects.HdrRouteReplica] = []string{a.cfg.Replica}
	if err := a.nc.PublishMsg(f.Msg(reply)); err != nil {
		a.log.Warn("rejection not sent", "err", err)
	}
	a.publishUsage(h, tokens{}, false)
}

// serve runs one request: accept, engine call, head, data, end, usage.
func (a *Adapter) serve(ctx context.Context, c *call, id, reply string, h nats.Header, body []byte) {
	defer a.done(c, id)
	var spans *requestSpans // nil: no tracer
	if a.tracer != nil {
		ctx, spans = a.traceServe(ctx, h)
		defer spans.end()
	}
	st := &stream{nc: a.nc, reply: reply}
	if a.cfg.Stages.Sampled(id) {
		st.stages, st.id = a.cfg.Stages, id
		ctx = stages.WithEngineTrace(ctx, a.cfg.Stages, id)
	}
	defer func() { a.tails.add(st, time.Now()) }()
	if err := st.accept(a.cfg.Replica, a.accept, a.cfg.AcceptDelay); err != nil {
		a.log.WarnContext(telemetry.LogContext(ctx, h), "accept not sent", "request", id, "err", err)
		return
	}
	if d, e := subjects.ParseDeadline(h.Get(subjects.HdrDeadline)); e == nil && !d.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d)
		defer cancel()
	}
	ec := &engineCall{a: a, ctx: spans.startEngine(ctx, a), st: st, h: h, body: body,
		lora: h.Get(subjects.HdrRouteLora) != ""}
	if h.Get(subjects.HdrMethod) == "" {
		// The engine names the model as it serves it; the client gets the
		// name it asked for. A stored response's GET or DELETE asks for
		// none.
		ec.rename = renaming(a.servedModel(h), h.Get(subjects.HdrModel))
	}
	used := ec.run()
	spans.engineDone(used)
	a.publishUsage(h, used, st.unfinished())
}

// servedModel is the name the engine serves the request's model under: the
// LoRA adapter the route chose, else the engine's model.
func (a *Adapter) servedModel(h nats.Header) string {
	if lora := h.Get(subjects.HdrRouteLora); lora != "" {
		return lora
	}
	return a.cfg.EngineModel
}

// publishUsage reports the tokens a request used on llm.usage.<tenant>, so
// the broker that reserved prompt + max_tokens at admission can settle them.
// Requests that did not come through a broker carry no tenant and report
// nothing.
func (a *Adapter) publishUsage(h nats.Header, t tokens, unfinished bool) {
	tenant := h.Get(subjects.HdrTenant)
	if subjects.ValidToken(tenant) != nil {
		return
	}
	prompt, _ := strconv.Atoi(h.Get(subjects.HdrPromptTokens))
	maxTokens, _ := strconv.Atoi(h.Get(subjects.HdrMaxTokens))
	model := h.Get(subjects.HdrRouteModel)
	if model == "" {
		model = a.cfg.Model
	}
	reserved, resumed := prompt+maxTokens, h.Get(subjects.HdrResume) != ""
	engine := t.PromptTokens
	a.ledger.record(h, tenant, model, t, unfinished)
	if resumed {
		// A continuation reserved nothing: its prompt (the request's and
		// the carried text) was charged with the part before it.
		reserved, t.PromptTokens = 0, 0
	}
	b, _ := json.Marshal(subjects.Usage{
		Tenant:             tenant,
		Model:              model,
		Replica:            a.cfg.Replica,
		RequestID:          h.Get(subjects.HdrRequestID),
		PromptTokens:       t.PromptTokens,
		CompletionTokens:   t.CompletionTokens,
		ReservedTokens:     reserved,
		Broker:             h.Get(subjects.HdrBroker),
		Resumed:            resumed,
		CachedTokens:       t.Cached,
		EnginePromptTokens: engine,
	})
	m := &nats.Msg{Subject: a.subj.Usage(tenant), Data: b}
	if broker := h.Get(subjects.HdrBroker); broker != "" {
		// Brokers that did not reserve the tokens skip it on the header.
		m.Header = nats.Header{subjects.HdrBroker: {broker}}
	}
	if err := a.nc.PublishMsg(m); err != nil {
		a.log.Warn("usage not published", "err", err)
	}
}
