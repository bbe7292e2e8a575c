package decider

import (
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/budget"
	"github.com/switchyard-llm/switchyard/features"
	"github.com/switchyard-llm/switchyard/internal/stages"
	"github.com/switchyard-llm/switchyard/owners"
	"github.com/switchyard-llm/switchyard/subjects"
	replyproto "github.com/switchyard-llm/switchyard/subjects/reply"
)

// Scratch is the per-request working memory of the route path, pooled so
// the path allocates little.
type Scratch struct {
	req      policy.Request
	key      string // the API key's hash whose budget is charged (Llm-Key)
	d        policy.Decision
	prefix   []uint64
	features []string
	exclude  []string
	avoid    []string
	prompt   []byte
	body     []byte
	routed   nats.Header // the routed notice's header, reused
	// noticeBudget is the value slice of the notice's budget remainder.
	noticeBudget [1]string
	promptFn     func() []byte // s.renderPrompt, bound once (a method value allocates)
	values       []string      // backs the header values setHeader adds; new per request
	// text backs the amounts formatted into header values: appended to
	// only, and replaced when full, so a string made from it never
	// changes, whichever request holds it.
	text    []byte
	rev     uint64 // the table revision revText spells
	revText string
	start   time.Time // when handle took the message: the decision's time
}

// NewScratch returns working memory for one request at a time; Get and
// Release pool them.
func NewScratch() *Scratch {
	s := new(Scratch)
	s.promptFn = s.renderPrompt
	return s
}

func (s *Scratch) reset() {
	s.req = policy.Request{}
	s.key = ""
	s.prefix = s.prefix[:0]
	s.features = s.features[:0]
	s.exclude = s.exclude[:0]
	s.avoid = s.avoid[:0]
	s.prompt = s.prompt[:0]
	s.body = nil
	s.values = nil // the last request's header map may still hold them
}

// Do is what Handle decided to do with one message.
type Do uint8

// What to do with a message.
const (
	DoForward   Do = iota + 1 // publish Route.Msg, the request for the chosen replica
	DoRefuse                  // answer the reply subject with Err
	DoReadOwner               // read the owner of stored response Owner, then decide (Owned)
)

// Action is Handle's answer for one message; the part holding the message
// acts on it.
type Action struct {
	Do    Do
	Route Route              // DoForward: where the request goes, and the request for the replica (Route.Msg)
	Err   *subjects.APIError // DoRefuse
	Owner string             // DoReadOwner: the stored response's id
}

func refuse(e *subjects.APIError) Action { return Action{Do: DoRefuse, Err: e} }

// NoticeHeader is a header for the routed notice, reused by every
// request s serves.
func (s *Scratch) NoticeHeader() nats.Header {
	if s.routed == nil {
		s.routed = make(nats.Header, 1)
	}
	return s.routed
}

// Get returns pooled working memory for one request; Release returns it.
func (dec *Decider) Get() *Scratch { return dec.scratch.Get().(*Scratch) }

// Release returns s to the pool without the request's body (up to 8 MiB)
// or an unusually large rendered prompt. The headers of the request s
// decided may still be in use: they are the caller's.
func (dec *Decider) Release(s *Scratch) {
	s.body = nil
	if cap(s.prompt) > 64<<10 {
		s.prompt = nil
	}
	dec.scratch.Put(s)
}

// Rejected counts a request refused outside the policy (an overloaded
// owner lookup), as the policy's refusals are.
func (dec *Decider) Rejected(code string) { dec.metrics.rejected(code) }

// Owned reads the owner of stored response id that Handle asked for, and
// decides with it where handle stopped: a GET or DELETE of the stored
// response goes to its replica; a turn continuing it is pinned there and
// decided.
func (dec *Decider) Owned(s *Scratch, subject, reply string, h nats.Header, data []byte, id string) Action {
	tenant := subjects.TenantFromRoute(subject)
	rec, e := dec.readOwner(tenant, id)
	if e != nil {
		dec.metrics.rejected(e.Code)
		return refuse(e)
	}
	if h.Get(subjects.HdrMethod) != "" {
		return dec.storedAt(s, tenant, reply, h, id, rec)
	}
	dec.pin(s, h, rec)
	return dec.decide(s, tenant, reply, h, data, s.start)
}

// Handle decides what to do with one request that came as a message (to a
// broker, from a gateway, a direct client or the batcher), its features
// in headers: forward it to the chosen
// replica (body untouched, the sender's reply subject kept), refuse it, or
// read the owner of the stored response it names first (owned goes on from
// there). It does no I/O, so its cost is the broker's own per-request CPU;
// what it learns on the way (the decision's sample, placement, cold load)
// is queued for the publisher.
func (dec *Decider) Handle(s *Scratch, subject, reply string, h nats.Header, data []byte) Action {
	start := dec.cfg.Now()
	if h == nil {
		h = nats.Header{}
	}
	s.reset()
	s.start = start
	tenant := subjects.TenantFromRoute(subject)
	if h.Get(subjects.HdrMethod) != "" {
		return dec.stored(tenant, h)
	}
	direct := strings.HasPrefix(subject, dec.direct)
	if direct {
		// The ledger keeps one record per client request id: a direct
		// client's own would let it take another request's (the batcher's
		// and a gateway's are theirs to set). Its key is no gateway's
		// word: it would charge another key's budget (a batch item's is
		// the batcher's, of the key that created the batch).
		delete(h, subjects.HdrClientRequestID)
		delete(h, subjects.HdrKey)
	}
	if strings.HasPrefix(subject, dec.batch) {
		// A batch item: the subject's tenant is the batch record's (only
		// the batcher publishes here), and it runs at batch priority
		// whatever it says. Its body is a tenant's line, read as a direct
		// client's.
		direct = true
		s.setHeader(h, subjects.HdrPriority, subjects.PriorityBatch)
	}
	if e := dec.fillRequest(s, tenant, direct, h, data); e != nil {
		dec.metrics.rejected(e.Code)
		return refuse(e)
	}
	if id := h.Get(subjects.HdrPreviousResponse); id != "" {
		return dec.readOwnerFirst(id)
	}
	return dec.decide(s, tenant, reply, h, data, start)
}

// decide decides a request fillRequest read: forward or refuse.
func (dec *Decider) decide(s *Scratch, tenant, reply string, h nats.Header, data []byte, start time.Time) Action {
	s.d = dec.router.Decide(&s.req, start, dec.rng)
	if dec.cfg.Stages != nil {
		dec.cfg.Stages.Mark(h.Get(subjects.HdrRequestID), stages.Decided)
	}
	d := &s.d
	d.Duration = dec.cfg.Now().Sub(start)
	dec.metrics.decided(d)
	if d.ControlLoad {
		dec.enqueue(dec.subj.ControlLoad(), subjects.ControlLoad{Model: d.LoadModel, Version: d.LoadVersion, Tenant: tenant, Requested: start.UnixMilli()})
	}
	dec.sample(&s.req, d, h, start)
	if dec.tracer != nil {
		dec.traceDecision(tenant, h, d, start)
	}
	if d.Err != nil {
		return refuse(d.Err)
	}
	if e := dec.charge(s, tenant, h); e != nil {
		dec.metrics.rejected(e.Code)
		return refuse(e)
	}
	// Every request sent is placed, blocks or none: the other deciders
	// count it in flight until the replica's next load delta.
	pl := &subjects.Placement{Model: d.Model, Replica: d.Replica, Prefill: d.Prefill, Uncached: d.SentPrefill}
	if d.Placement && len(s.req.Prefix) > 0 {
		pl.Blocks = append([]uint64(nil), s.req.Prefix...)
	}
	dec.enqueue(dec.subj.Placement(d.Model), pl)
	route := Route{Replica: d.Replica, Pool: d.Pool, Reason: d.Reason, Decision: d, Placement: *pl}
	s.setHeader(h, subjects.HdrRouteModel, d.Model)
	s.setHeader(h, subjects.HdrRouteVersion, d.Version)
	s.setHeader(h, subjects.HdrRoutePool, d.Pool)
	s.setHeader(h, subjects.HdrRouteReplica, d.Replica)
	s.setHeader(h, subjects.HdrRouteReason, d.Reason)
	if d.Lora != "" {
		s.setHeader(h, subjects.HdrRouteLora, d.Lora)
	} else {
		delete(h, subjects.HdrRouteLora)
	}
	if d.Prefill != "" {
		s.setHeader(h, subjects.HdrRoutePrefill, d.Prefill)
	} else {
		delete(h, subjects.HdrRoutePrefill)
	}
	if s.revText == "" || s.rev != d.TableRevision {
		s.rev, s.revText = d.TableRevision, strconv.FormatUint(d.TableRevision, 10)
	}
	s.setHeader(h, subjects.HdrRouteTableRev, s.revText)
	s.setHeader(h, subjects.HdrTenant, tenant)
	s.setHeader(h, subjects.HdrBroker, dec.cfg.ID)
	// The prediction travels with the request; the replica's adapter
	// sends it back beside the first token it observed, and only to the
	// decider it names (switchyard_broker_predicted_ttft_error_seconds).
	if ms := int64(d.PredictedTTFT + 0.5); ms > 0 && ms <= subjects.MaxHeartbeatMillis {
		s.setHeader(h, subjects.HdrPredictedTTFT, strconv.FormatInt(ms, 10))
	} else {
		delete(h, subjects.HdrPredictedTTFT)
	}
	// The max_tokens the quota reserved (the client's, or the model's
	// default) travels with the request, and the adapter writes it into the
	// body it sends the engine: the engine cannot generate past it.
	if d.ReservedTokens > s.req.PromptTokens {
		s.setHeader(h, subjects.HdrMaxTokens, strconv.Itoa(d.ReservedTokens-s.req.PromptTokens))
	} else {
		delete(h, subjects.HdrMaxTokens)
	}
	route.Budget = h.Get(subjects.HdrRouteBudget)
	return dec.forwardTo(s, route, reply, h, data)
}

// forwardTo is the Action that forwards the request on route.
func (dec *Decider) forwardTo(s *Scratch, route Route, reply string, h nats.Header, data []byte) Action {
	// A direct tenant's reply is a service-import reply (_R_.…), which the
	// server refuses as a published reply: it travels in Llm-Reply. A
	// sender's own Llm-Reply is never passed on.
	if subjects.IsServiceReply(reply) {
		s.setHeader(h, subjects.HdrReply, reply)
		reply = ""
	} else {
		delete(h, subjects.HdrReply)
	}
	route.Msg = nats.Msg{Subject: dec.subj.Replica(route.Replica), Reply: reply, Header: h, Data: data}
	return Action{Do: DoForward, Route: route}
}

// setHeader sets one value, reusing the slice already there. A header NATS
// just decoded holds none of the route headers, so each would be a new
// one-element slice: they are cut from one array instead.
// amount is m as a header value, formatted into s.text: no allocation of
// its own.
func (s *Scratch) amount(m budget.Micro) string {
	if cap(s.text)-len(s.text) < 32 {
		s.text = make([]byte, 0, 1024)
	}
	n := len(s.text)
	s.text = m.Append(s.text)
	return unsafe.String(&s.text[n], len(s.text)-n)
}

// setHeaders sets k to vs (at most 16 values), as setHeader does.
func (s *Scratch) setHeaders(h nats.Header, k string, vs []string) {
	if old := h[k]; len(old) == len(vs) {
		copy(old, vs)
		return
	}
	if len(s.values)+len(vs) > cap(s.values) {
		s.values = make([]string, 0, 16)
	}
	n := len(s.values)
	s.values = append(s.values, vs...)
	h[k] = s.values[n : n+len(vs) : n+len(vs)]
}

func (s *Scratch) setHeader(h nats.Header, k, v string) {
	if old := h[k]; len(old) == 1 {
		old[0] = v
		return
	}
	if len(s.values) == cap(s.values) {
		s.values = make([]string, 0, 16)
	}
	s.values = append(s.values, v)
	n := len(s.values)
	h[k] = s.values[n-1 : n : n]
}

// fillRequest turns headers into a policy request. A gateway's request
// (llm.gw.<tenant>) carries its features in headers, computed from the body
// the gateway parsed. A direct client's (llm.route.<tenant>) headers are
// its own claims: the broker computes prompt tokens, max tokens, prefix
// blocks and flags from the body itself, and ignores those headers and
// Llm-Cold-Waited, which only a gateway holding the request may set. A
// request that continues a stored response is pinned to its replica.
func (dec *Decider) fillRequest(s *Scratch, tenant string, direct bool, h nats.Header, body []byte) *subjects.APIError {
	if e := checkTenant(tenant); e != nil {
		return e
	}
	if e := checkBounds(h); e != nil {
		return e
	}
	if direct {
		// The reservation is keyed by the request id: a direct client's
		// own could name another request's. Direct clients cannot cancel
		// (only gateways publish cancels), so nothing needs theirs.
		s.setHeader(h, subjects.HdrRequestID, nuid.Next())
		// The stored response continued is the body's previous_response_id
		// (scanBody), checked against the tenant's: a header naming
		// another would pass the check for one and send the engine the
		// other.
		for _, k := range [...]string{subjects.HdrPromptTokens, subjects.HdrMaxTokens, subjects.HdrPrefix,
			subjects.HdrFeatures, subjects.HdrColdWaited, subjects.HdrResume, subjects.HdrResumeTokens,
			subjects.HdrPreviousResponse} {
			delete(h, k)
		}
	}
	q := &s.req
	q.Tenant = tenant
	q.Model = h.Get(subjects.HdrModel)
	q.Endpoint = h.Get(subjects.HdrEndpoint)
	q.Conversation = h.Get(subjects.HdrConversation)
	q.Priority = h.Get(subjects.HdrPriority)
	q.ID = h.Get(subjects.HdrRequestID)
	if e := checkPriority(q.Priority); e != nil {
		return e
	}
	if v := h.Get(subjects.HdrKey); v != "" {
		// The key's hash goes no further than the decider: the replica
		// and the ledger get its id (charge).
		s.key = v
		delete(h, subjects.HdrKey)
	}
	var err error
	if q.PromptTokens, err = intHeader(h, subjects.HdrPromptTokens); err != nil {
		return err.(*subjects.APIError)
	}
	if q.MaxTokens, err = intHeader(h, subjects.HdrMaxTokens); err != nil {
		return err.(*subjects.APIError)
	}
	var e *subjects.APIError
	if q.Deadline, e = subjects.ParseDeadline(h.Get(subjects.HdrDeadline)); e != nil {
		return e
	}
	if v := h.Get(subjects.HdrTTFTObjective); v != "" {
		o, ok := subjects.ParseTTFTObjective(v)
		if !ok {
			return subjects.NewError(400, subjects.CodeInvalidRequest, "Llm-TTFT-Objective must be a duration from 1ms to 10m")
		}
		q.TTFTObjective = o
	}
	if v := h.Get(subjects.HdrPrefix); v != "" {
		p, perr := features.ParsePrefixHeader(s.prefix[:0], v)
		if perr != nil {
			return subjects.NewError(400, subjects.CodeInvalidRequest, "Llm-Prefix: "+perr.Error())
		}
		s.prefix = p
		q.Prefix = p
	}
	if v := h.Get(subjects.HdrFeatures); v != "" {
		s.features = appendSplit(s.features, v)
		q.Features = s.features
	}
	q.ColdWaited = h.Get(subjects.HdrColdWaited) != ""
	if v := h.Get(subjects.HdrResume); v != "" {
		q.ResumeFrom = v
		q.ResumeTokens, _ = strconv.Atoi(h.Get(subjects.HdrResumeTokens))
	}
	if v := h.Get(subjects.HdrExclude); v != "" {
		s.exclude = appendSplit(s.exclude, v)
		q.Exclude = s.exclude
	}
	if v := h.Get(subjects.HdrAvoid); v != "" {
		s.avoid = appendSplit(s.avoid, v)
		q.Avoid = s.avoid
	}
	s.body = body
	q.Prompt = s.promptFn
	if direct || q.Model == "" || h.Get(subjects.HdrPromptTokens) == "" {
		// A body's model is bounded by its parse, as the header's is by
		// checkBounds.
		if e := dec.scanBody(s, h); e != nil {
			return e
		}
	}
	return nil
}

// checkBounds refuses a request whose routing headers are over their
// bounds, in time independent of their size: only lengths and separators
// are counted, nothing is split or parsed (docs/security.md, "Bounds").
func checkBounds(h nats.Header) *subjects.APIError {
	for _, k := range [...]string{subjects.HdrModel, subjects.HdrEndpoint, subjects.HdrConversation, subjects.HdrPriority,
		subjects.HdrPromptTokens, subjects.HdrMaxTokens, subjects.HdrDeadline, subjects.HdrTTFTObjective, subjects.HdrPrefix, subjects.HdrFeatures,
		subjects.HdrExclude, subjects.HdrAvoid, subjects.HdrRequestID, subjects.HdrColdWaited, subjects.HdrResume, subjects.HdrResumeTokens,
		subjects.HdrTraceparent, subjects.HdrTracestate} {
		v := h[k]
		if len(v) > 1 {
			return subjects.NewError(400, subjects.CodeInvalidRequest, k+" may appear once")
		}
		if len(v) == 1 && len(v[0]) > subjects.MaxHeaderChars {
			return subjects.NewError(400, subjects.CodeInvalidRequest, k+" must be at most "+strconv.Itoa(subjects.MaxHeaderChars)+" characters")
		}
	}
	switch {
	case len(h.Get(subjects.HdrModel)) > subjects.MaxModelChars:
		return errModelLength()
	case len(h.Get(subjects.HdrRequestID)) > subjects.MaxRequestIDChars:
		return subjects.NewError(400, subjects.CodeInvalidRequest, subjects.HdrRequestID+" must be at most "+strconv.Itoa(subjects.MaxRequestIDChars)+" characters")
	case strings.Count(h.Get(subjects.HdrExclude), ",") >= subjects.MaxExclude:
		return subjects.NewError(400, subjects.CodeInvalidRequest, subjects.HdrExclude+" may name at most "+strconv.Itoa(subjects.MaxExclude)+" replicas")
	case strings.Count(h.Get(subjects.HdrAvoid), ",") >= subjects.MaxAvoid:
		return subjects.NewError(400, subjects.CodeInvalidRequest, subjects.HdrAvoid+" may name at most "+strconv.Itoa(subjects.MaxAvoid)+" replicas")
	case strings.Count(h.Get(subjects.HdrFeatures), ",") >= subjects.MaxFeatures:
		return subjects.NewError(400, subjects.CodeInvalidRequest, subjects.HdrFeatures+" may name at most "+strconv.Itoa(subjects.MaxFeatures)+" flags")
	}
	return nil
}

func intHeader(h nats.Header, k string) (int, error) {
	v := h.Get(k)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, subjects.NewError(400, subjects.CodeInvalidRequest, k+" must be a non-negative integer")
	}
	return n, nil
}

func appendSplit(dst []string, v string) []string {
	for v != "" {
		i := strings.IndexByte(v, ',')
		if i < 0 {
			return append(dst, strings.TrimSpace(v))
		}
		if t := strings.TrimSpace(v[:i]); t != "" {
			dst = append(dst, t)
		}
		v = v[i+1:]
	}
	return dst
}

// sample publishes the explained decision on llm.decision.<pool>, at the
// table's decision_sample rate, drawn from the goroutine-safe global
// source: the route and gateway endpoints call it at once.
func (dec *Decider) sample(q *policy.Request, d *policy.Decision, h nats.Header, decided time.Time) {
	t := dec.router.Table()
	rate := 1.0
	if t != nil {
		rate = t.Policy.DecisionSample
	}
	if rate <= 0 || (rate < 1 && rand.Float64() >= rate) {
		return
	}
	w := d.Wire(q)
	w.RequestID = q.ID
	w.TraceID = traceID(h.Get(subjects.HdrTraceparent))
	w.DecidedUnixMil = decided.UnixMilli()
	pool := d.Pool
	if pool == "" {
		pool = "none"
	}
	dec.enqueue(dec.subj.Decision(pool), &w)
}

// traceID extracts the trace id of a W3C traceparent (version-traceid-spanid-flags).
func traceID(tp string) string {
	if len(tp) >= 55 && tp[2] == '-' {
		return tp[3:35]
	}
	return ""
}

// Reject fills msg with a single rejection message for reply
// (docs/protocol.md, "The reply protocol"); msg stays empty when there is no one to tell.
func (dec *Decider) Reject(msg *nats.Msg, reply string, e *subjects.APIError) {
	if reply == "" {
		*msg = nats.Msg{}
		return
	}
	f := replyproto.Rejection(e)
	*msg = *f.Msg(reply)
}

// Explain answers a dry run for the request on subject (llm.explain.<tenant>):
// the decision with its alternatives, nothing forwarded and nothing
// committed. The request is given in headers, as for llm.route, or as a
// JSON body {"model", "conversation", "prompt_tokens", ...}.
func (dec *Decider) Explain(subject string, h nats.Header, data []byte) (any, *subjects.APIError) {
	s := NewScratch()
	tenant := subjects.TenantFromRoute(subject)
	if h == nil {
		h = nats.Header{}
	}
	if len(data) > 0 && h.Get(subjects.HdrModel) == "" {
		var x ExplainRequest
		if err := json.Unmarshal(data, &x); err != nil {
			return nil, subjects.NewError(400, subjects.CodeInvalidRequest, "explain: "+err.Error())
		}
		x.toHeaders(h)
	}
	if apiErr := dec.fillRequest(s, tenant, false, h, nil); apiErr != nil {
		return nil, apiErr
	}
	if id := h.Get(subjects.HdrPreviousResponse); id != "" {
		e := checkResponseID(id)
		var rec owners.Record
		if e == nil {
			rec, e = dec.readOwner(tenant, id)
		}
		if e != nil {
			return nil, e
		}
		dec.pin(s, h, rec)
	}
	start := dec.cfg.Now()
	s.d = dec.router.Explain(&s.req, start, rand.New(rand.NewPCG(uint64(start.UnixNano()), 1)))
	s.d.Duration = dec.cfg.Now().Sub(start)
	w := s.d.Wire(&s.req)
	w.DecidedUnixMil = start.UnixMilli()
	return w, nil
}

// ExplainRequest is the JSON form of a hypothetical request for llm.explain.
type ExplainRequest struct {
	Model        string `json:"model"`
	Conversation string `json:"conversation,omitempty"`
	PromptTokens int    `json:"prompt_tokens,omitempty"`
	MaxTokens    int    `json:"max_tokens,omitempty"`
	Priority     string `json:"priority,omitempty"`
	// TTFTObjective is a TTFT objective as X-Switchyard-TTFT-Objective
	// takes it ("800ms").
	TTFTObjective string   `json:"ttft_objective,omitempty"`
	Features      []string `json:"features,omitempty"`
	Prefix        string   `json:"prefix,omitempty"`
	// Endpoint is the API path, e.g. /v1/responses (default chat): only
	// replicas whose engine serves it are candidates.
	Endpoint string `json:"endpoint,omitempty"`
	// PreviousResponse is a stored response the request would continue.
	PreviousResponse string `json:"previous_response,omitempty"`
}

func (x *ExplainRequest) toHeaders(h nats.Header) {
	h.Set(subjects.HdrModel, x.Model)
	if x.Conversation != "" {
		h.Set(subjects.HdrConversation, x.Conversation)
	}
	h.Set(subjects.HdrPromptTokens, strconv.Itoa(x.PromptTokens))
	if x.MaxTokens > 0 {
		h.Set(subjects.HdrMaxTokens, strconv.Itoa(x.MaxTokens))
	}
	if x.TTFTObjective != "" {
		h.Set(subjects.HdrTTFTObjective, x.TTFTObjective)
	}
	if x.Priority != "" {
		h.Set(subjects.HdrPriority, x.Priority)
	}
	if len(x.Features) > 0 {
		h.Set(subjects.HdrFeatures, strings.Join(x.Features, ","))
	}
	if x.Prefix != "" {
		h.Set(subjects.HdrPrefix, x.Prefix)
	}
	if x.Endpoint != "" {
		h.Set(subjects.HdrEndpoint, x.Endpoint)
	}
	if x.PreviousResponse != "" {
		h.Set(subjects.HdrPreviousResponse, x.PreviousResponse)
	}
}
