package decider

import (
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/features"
	"github.com/switchyard-llm/switchyard/subjects"
)

// Request is one request to decide, as its sender parsed it: the policy's
// request, and what the decider reads beside it. A gateway that decides
// hands it to Decide as it is; a gateway that sends to the brokers encodes
// it into headers (Encode), which Handle decodes there.
type Request struct {
	// Policy holds the routing features. Its Tenant is the tenant the
	// request is charged to; Prompt and Pin are the decider's to set.
	Policy policy.Request
	// Key is the hash of the API key the request came with (Llm-Key): its
	// budget is charged beside the tenant's.
	Key string
	// Header is the request's header for the replica (the request id,
	// stream, trace context, client request id): Decide writes into it the
	// features the replica reads and the route headers.
	Header nats.Header
	// Reply is the subject the replica answers on.
	Reply string
	// Body is the request body, sent to the replica untouched; a regex
	// cascade rule renders its prompt from it.
	Body []byte
}

// Route is where a forwarded request goes, and why.
type Route struct {
	Replica string
	Pool    string
	Reason  string
	// Decision is the explained decision (its alternatives, load, the
	// steps taken); it belongs to the Scratch that decided and is valid
	// until that Scratch is released. Nil for a stored response's GET or
	// DELETE, which no policy decides.
	Decision *policy.Decision
	// Placement is what the other deciders count in flight on Replica.
	Placement subjects.Placement
	// Budget is what the request's budget has left after it
	// (Llm-Route-Budget), "" when it is under none.
	Budget string
	// Msg is the request for the replica: its subject, the sender's reply
	// subject and the header with the route headers, the body untouched.
	Msg nats.Msg
}

// Encode writes q's routing features into h, as Handle reads them: the
// form a request takes to cross the network to a broker.
func (q *Request) Encode(h nats.Header) {
	p := &q.Policy
	var s Scratch
	encodeReplica(h, p, &s)
	if p.Conversation != "" {
		h[subjects.HdrConversation] = []string{p.Conversation}
	}
	if p.TTFTObjective > 0 {
		h[subjects.HdrTTFTObjective] = []string{p.TTFTObjective.String()}
	}
	if len(p.Features) > 0 {
		h[subjects.HdrFeatures] = []string{strings.Join(p.Features, ",")}
	}
	if len(p.Exclude) > 0 {
		h[subjects.HdrExclude] = []string{strings.Join(p.Exclude, ",")}
	}
	if len(p.Avoid) > 0 {
		h[subjects.HdrAvoid] = []string{strings.Join(p.Avoid, ",")}
	}
	if p.ColdWaited {
		h[subjects.HdrColdWaited] = []string{"1"}
	}
	if q.Key != "" {
		h[subjects.HdrKey] = []string{q.Key}
	}
}

// encodeReplica writes the features the replica's adapter reads from the
// request's header (docs/protocol.md): the model asked for, endpoint,
// priority, token counts, deadline, prefix blocks and the continuation.
// The values are cut from s's arrays (setHeader).
func encodeReplica(h nats.Header, p *policy.Request, s *Scratch) {
	set := s.setHeader
	set(h, subjects.HdrModel, p.Model)
	set(h, subjects.HdrEndpoint, p.Endpoint)
	if p.Priority != "" {
		set(h, subjects.HdrPriority, p.Priority)
	}
	set(h, subjects.HdrPromptTokens, strconv.Itoa(p.PromptTokens))
	if p.MaxTokens > 0 {
		set(h, subjects.HdrMaxTokens, strconv.Itoa(p.MaxTokens))
	}
	if !p.Deadline.IsZero() {
		set(h, subjects.HdrDeadline, strconv.FormatInt(p.Deadline.UnixMilli(), 10))
	}
	if len(p.Prefix) > 0 {
		set(h, subjects.HdrPrefix, features.FormatPrefixHeader(p.Prefix))
	}
	if p.ResumeFrom != "" {
		set(h, subjects.HdrResume, p.ResumeFrom)
		set(h, subjects.HdrResumeTokens, strconv.Itoa(p.ResumeTokens))
	}
}

// Decide decides one request in the sender's own process: nothing is
// encoded to be parsed back, and nothing is published but the events
// every decision queues (its sample, placement, cold load). It returns
// the route, or the refusal the sender answers with. A request naming a
// stored response is the brokers' to decide (they read the owners
// bucket): Decide refuses it as a caller's error.
func (dec *Decider) Decide(s *Scratch, in *Request) (Route, *subjects.APIError) {
	start := dec.cfg.Now()
	s.reset()
	s.start = start
	s.req = in.Policy
	s.req.Pin = ""
	s.key = in.Key
	s.body = in.Body
	s.req.Prompt = s.promptFn
	h := in.Header
	if h == nil {
		h = nats.Header{}
	}
	q := &s.req
	q.ID = h.Get(subjects.HdrRequestID)
	e := checkTenant(q.Tenant)
	if e == nil {
		e = checkRequest(q)
	}
	if e == nil && h.Get(subjects.HdrPreviousResponse) != "" {
		e = subjects.NewError(400, subjects.CodeInvalidRequest, "a request naming a stored response is decided by a broker, which reads its owner")
	}
	if e != nil {
		dec.metrics.rejected(e.Code)
		return Route{}, e
	}
	encodeReplica(h, q, s)
	a := dec.decide(s, q.Tenant, in.Reply, h, in.Body, start)
	return a.Route, a.Err
}

func checkTenant(tenant string) *subjects.APIError {
	if err := subjects.ValidToken(tenant); err != nil {
		return subjects.NewError(400, subjects.CodeInvalidRequest, "tenant: "+err.Error())
	}
	return nil
}

// checkRequest refuses what no sender may ask of a request decided in
// process. (Handle checks a message's model with its other headers'
// bounds, before reading any, and a body's model is bounded as the body
// is parsed.)
func checkRequest(q *policy.Request) *subjects.APIError {
	if e := checkPriority(q.Priority); e != nil {
		return e
	}
	if len(q.Model) > subjects.MaxModelChars {
		return errModelLength()
	}
	return nil
}

func checkPriority(p string) *subjects.APIError {
	switch p {
	case "", subjects.PriorityInteractive, subjects.PriorityBatch:
		return nil
	}
	return subjects.NewError(400, subjects.CodeInvalidRequest, "Llm-Priority must be interactive or batch")
}

func errModelLength() *subjects.APIError {
	return subjects.NewError(400, subjects.CodeInvalidRequest, "model must be at most "+strconv.Itoa(subjects.MaxModelChars)+" characters")
}
