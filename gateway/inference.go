package gateway

import (
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/features"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// serveInference handles the three OpenAI inference endpoints: validate
// everything the gateway can tell, compute the routing features and relay
// the request through NATS.
func (g *Gateway) serveInference(endpoint string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		t := g.snapshot(w)
		if t == nil {
			return
		}
		u, apiErr := g.prepare(w, r, t, endpoint)
		// A body cut by its deadline cancels the request's context too, but
		// is answered: the client is slow, not gone.
		if apiErr != nil && apiErr.Status != http.StatusRequestTimeout && r.Context().Err() != nil {
			g.metrics.clientGone.Inc() // gone mid-body: nothing was published
			return
		}
		if apiErr != nil {
			g.metrics.rejected(endpoint, apiErr.Status)
			writeErrorAs(w, dialectOf(endpoint), apiErr)
			return
		}
		u.admitted = true
		defer func() { g.conc.done(u.tenant, u.accepted) }()
		u.started = start
		g.relay(w, r, u)
	}
}

// serveStored relays a GET or DELETE of a stored response
// (/v1/responses/{id}) to the replica holding it.
func (g *Gateway) serveStored(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	t := g.snapshot(w)
	if t == nil {
		return
	}
	tenant, apiErr := g.tenantOf(r, t)
	id := r.PathValue("id")
	if apiErr == nil && !features.ValidResponseID(id) {
		apiErr = subjects.NewError(http.StatusNotFound, subjects.CodePreviousResponseNotFound, "Response with id "+strconv.Quote(id)+" not found.")
	}
	if apiErr != nil {
		g.metrics.rejected(subjects.EndpointResponses, apiErr.Status)
		writeError(w, apiErr)
		return
	}
	h := nats.Header{
		subjects.HdrEndpoint:         {subjects.EndpointResponses + "/" + id},
		subjects.HdrMethod:           {r.Method},
		subjects.HdrPreviousResponse: {id},
		subjects.HdrClientRequestID:  {w.Header().Get("X-Request-Id")},
		subjects.HdrTraceparent:      {clientTraceparent(r)},
	}
	deadline := start.Add(g.cfg.DefaultTimeout)
	h[subjects.HdrDeadline] = []string{strconv.FormatInt(deadline.UnixMilli(), 10)}
	g.relay(w, r, &upstream{tenant: tenant, endpoint: subjects.EndpointResponses, dialect: dialectResponses,
		hdr: h, deadline: deadline, started: start})
}

// A request refused before its body was read keeps its connection when
// its body, of a declared length up to refusedDrain, arrives within
// refusedWait of the answer being ready (letGo): a client sends it with its
// headers, and a new connection for each refusal would cost the overloaded
// gateway far more than that read.
const (
	refusedDrain = 64 << 10
	refusedWait  = 2 * time.Millisecond
)

// refuseUnread readies the connection of an HTTP/1 request refused before
// its body was read: net/http reads what is left of a body before it
// answers, so a body that is not there within refusedWait closes the
// connection and the client that sent only its headers has its answer
// all the same. A longer or unknown body, or one awaiting a 100 Continue,
// closes it at once; none at all keeps it. An HTTP/2 stream is reset on
// its own (closing would end the client's other streams).
func refuseUnread(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor != 1 || r.ContentLength == 0 {
		return
	}
	// A client that asked to be told to send its body (Expect:
	// 100-continue) sends none unasked.
	if b, ok := r.Body.(*watchedBody); ok && r.ContentLength > 0 && r.ContentLength <= refusedDrain && r.Header.Get("Expect") == "" {
		b.drainFor = refusedWait
		return
	}
	w.Header().Set("Connection", "close")
}

// prepare turns the HTTP request into an upstream request, or the 4xx that
// it deserves without ever reaching a broker.
//
// The request holds a place under the gateway's concurrency limit from
// before its body is read: prepare gives it back when it fails, the
// caller when the request is over.
func (g *Gateway) prepare(w http.ResponseWriter, r *http.Request, t *table.Snapshot, endpoint string) (_ *upstream, apiErr *subjects.APIError) {
	tenant, apiErr := g.tenantOf(r, t)
	if apiErr != nil {
		return nil, apiErr
	}
	h := nats.Header{}
	now := time.Now()
	deadline := now.Add(g.cfg.DefaultTimeout)
	if v := r.Header.Get("X-Request-Timeout"); v != "" {
		secs, err := strconv.ParseFloat(v, 64)
		if err != nil || secs <= 0 || secs > 86400 {
			return nil, badHeader("X-Request-Timeout", "must be a number of seconds between 0 and 86400")
		}
		deadline = now.Add(time.Duration(secs * float64(time.Second)))
	}
	var objective time.Duration
	if v := r.Header.Get("X-Switchyard-TTFT-Objective"); v != "" {
		o, ok := subjects.ParseTTFTObjective(v)
		if !ok {
			return nil, badHeader("X-Switchyard-TTFT-Objective", "must be a duration from 1ms to 10m, such as 800ms or 2s")
		}
		objective = o
	}
	conversation := r.Header.Get("X-Conversation-Id")
	if conversation != "" && !printable(conversation, 128) {
		return nil, badHeader("X-Conversation-Id", "must be 1 to 128 printable ASCII characters")
	}
	priority := subjects.PriorityInteractive
	if v := r.Header.Get("X-Priority"); v != "" {
		if v != subjects.PriorityInteractive && v != subjects.PriorityBatch {
			return nil, badHeader("X-Priority", "must be interactive or batch")
		}
		priority = v
	}
	clientID := r.Header.Get("X-Request-Id")
	if clientID != "" && !printable(clientID, 128) {
		return nil, badHeader("X-Request-Id", "must be 1 to 128 printable ASCII characters")
	}

	if !g.conc.admit(tenant, priority == subjects.PriorityBatch, time.Now()) {
		g.metrics.overloaded.WithLabelValues(priority).Inc()
		refuseUnread(w, r)
		return nil, errOverloaded()
	}
	prepared := false
	defer func() {
		if !prepared { // an error, or a panic net/http recovers from
			g.conc.done(tenant, false)
		}
	}()
	body, apiErr := g.receiveBody(w, r)
	if apiErr != nil {
		return nil, apiErr
	}
	bodyAt := g.cfg.Stages.Now()
	pb := g.getParsed()
	defer g.putParsed(pb)
	req := &pb.req
	perr := features.ParseRequestInto(req, endpoint, body)
	if perr != nil {
		if pe := (*features.ParseError)(nil); errors.As(perr, &pe) {
			return nil, pe.APIError()
		}
		return nil, subjects.NewError(400, subjects.CodeInvalidRequest, perr.Error())
	}

	// The routing features, typed: a gateway that decides hands them to
	// its decider as they are; one that sends to the brokers encodes them
	// into headers (decide.go).
	q := policy.Request{
		Tenant: tenant, Model: req.Model, Endpoint: endpoint, Conversation: conversation, Priority: priority,
		PromptTokens: req.PromptTokens, Deadline: time.UnixMilli(deadline.UnixMilli()), TTFTObjective: objective,
	}
	if req.MaxTokens != nil && *req.MaxTokens > 0 {
		q.MaxTokens = *req.MaxTokens
	}
	if endpoint != subjects.EndpointEmbeddings {
		pol := &t.Policy
		if prefix := features.AppendPrefix(pb.blocks[:0], req.Prompt, pol.PrefixBlockChars, pol.PrefixMaxBlocks); len(prefix) > 0 {
			q.Prefix = slices.Clone(prefix)
		}
	}
	if f := features.Flags(req.Prompt); f != "" {
		q.Features = strings.Split(f, ",")
	}
	if req.Stream {
		h[subjects.HdrStream] = []string{"1"}
	}
	if req.PreviousResponseID != "" {
		h[subjects.HdrPreviousResponse] = []string{req.PreviousResponseID}
	}
	// The id the answer carries (the client's, else the gateway's) names
	// the request on the wire too.
	h[subjects.HdrClientRequestID] = []string{w.Header().Get("X-Request-Id")}
	// The decider charges the key's budget too.
	_, key, _ := g.keyOf(r, t)
	// A client's trace is continued only when its traceparent is valid W3C
	// (anything else starts a new trace, as the spec says), and tracestate
	// is bounded: an oversized header must not push a request past the
	// NATS max payload.
	if tp := r.Header.Get("Traceparent"); validTraceparent(tp) {
		h[subjects.HdrTraceparent] = []string{tp}
		if ts := r.Header.Get("Tracestate"); ts != "" && len(ts) <= 512 {
			h[subjects.HdrTracestate] = []string{ts}
		}
	} else {
		h[subjects.HdrTraceparent] = []string{newTraceparent()}
	}
	prepared = true
	return &upstream{
		tenant: tenant, endpoint: endpoint, dialect: dialectOf(endpoint), model: req.Model, stream: req.Stream,
		body: body, hdr: h, route: q, key: key, deadline: deadline, bodyAt: bodyAt,
	}, nil
}

// parsed holds the buffers of one feature extraction, pooled so that a
// request's extraction allocates the same whatever its body size.
type parsed struct {
	req    features.Request
	blocks [features.MaxPrefixBlocks]uint64
}

// maxPooledPrompt bounds the prompt buffer a pooled extraction keeps.
const maxPooledPrompt = 1 << 20

func (g *Gateway) getParsed() *parsed {
	if pb, ok := g.parsed.Get().(*parsed); ok {
		return pb
	}
	return new(parsed)
}

func (g *Gateway) putParsed(pb *parsed) {
	if cap(pb.req.Prompt) <= maxPooledPrompt {
		g.parsed.Put(pb)
	}
}

// readBody reads a request body in one allocation when the client declared
// its length (the usual case), instead of growing a buffer by doubling.
func readBody(r io.Reader, declared, limit int64) ([]byte, error) {
	if declared <= 0 || declared > limit {
		return io.ReadAll(r)
	}
	b := make([]byte, declared, declared+1)
	if _, err := io.ReadFull(r, b); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			err = errors.New("the body is shorter than its Content-Length")
		}
		return nil, err
	}
	// net/http enforces Content-Length; a read past it only confirms EOF.
	var one [1]byte
	if n, err := r.Read(one[:]); n > 0 || (err != nil && err != io.EOF) {
		if err == nil {
			err = errors.New("the body is longer than its Content-Length")
		}
		return nil, err
	}
	return b, nil
}

// validTraceparent accepts version-traceid-spanid-flags in lowercase hex,
// with non-zero trace and span ids.
func validTraceparent(tp string) bool {
	if len(tp) != 55 || tp[2] != '-' || tp[35] != '-' || tp[52] != '-' || tp[:2] == "ff" {
		return false
	}
	zeroTrace, zeroSpan := true, true
	for i := 0; i < len(tp); i++ {
		if i == 2 || i == 35 || i == 52 {
			continue
		}
		c := tp[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
		if c != '0' {
			if i > 2 && i < 35 {
				zeroTrace = false
			} else if i > 35 && i < 52 {
				zeroSpan = false
			}
		}
	}
	return !zeroTrace && !zeroSpan
}

func badHeader(name, msg string) *subjects.APIError {
	e := subjects.NewError(400, subjects.CodeInvalidRequest, name+" "+msg)
	e.Param = name
	return e
}

func printable(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
