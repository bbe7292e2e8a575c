package adapter

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/internal/sse"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/subjects/reply"
)

// callEngine calls the engine and relays its answer, in three phases: the
// head (the request, and the engine's status or failure), the inline answer
// (a non-streamed body that fits one message) and the stream (everything
// else, read by read). It returns the tokens to settle: the engine's usage,
// an estimate when it reported none, zero when the engine did no work.
func (a *Adapter) callEngine(ctx context.Context, st *stream, h nats.Header, body []byte) tokens {
	// A split request's prefill leg runs first, elsewhere: the keepalives
	// cover it.
	st.startKeepalive(a.cfg.KeepaliveEvery)
	kv := a.prefillLeg(ctx, h, body)
	if ctx.Err() != nil {
		st.fail(callError(ctx, context.Cause(ctx)))
		return tokens{}
	}
	req, e := a.engineRequestKV(ctx, h, body, kv)
	if e != nil {
		st.fail(e)
		return tokens{}
	}
	prompt := 0
	// A split request's prompt was computed by its prefill leg; a batch
	// line's at a priority engine waits behind every interactive one.
	behind := a.behindInteractive(h)
	if kv == nil && !behind {
		prompt = promptTokens(h)
	}
	if behind {
		a.batchHeld.Add(1)
		defer a.batchHeld.Add(-1)
	}
	prefilled, ahead := a.load.queuePrefill(prompt)
	slotWait := a.slotWait(behind)
	a.loadChanged()
	defer prefilled()
	start := time.Now()
	resp, rejected := a.engineHeadKV(ctx, st, h, req, kv != nil)
	if rejected {
		// The engine could not pull what the prefill computed (blocks
		// expired or unknown): it prefills the request itself.
		a.servedWhole(h, wholeDecodeRejected)
		if req, e = a.engineRequestKV(ctx, h, body, nil); e != nil {
			st.fail(e)
			return tokens{}
		}
		start = time.Now()
		resp, _ = a.engineHeadKV(ctx, st, h, req, false)
	}
	if resp == nil {
		return tokens{}
	}
	defer resp.Body.Close()

	ct := resp.Header.Get("Content-Type")
	hd := a.head(h, resp, ct)
	scan := usageScanner{sse: sse.IsEventStream(ct)}
	if rec := a.newOwnerRecorder(h); rec != nil {
		scan.observe = func(p []byte) { rec.observe(ctx, p) }
	}
	a.forgetDeleted(ctx, h, resp.StatusCode)
	var onFirst func()
	var first time.Time
	if scan.sse {
		if st.send(hd) != nil {
			return tokens{}
		}
		// Only a stream's first byte is a time to first token: a
		// non-streamed body arrives when generation is over.
		onFirst = func() {
			first = time.Now()
			ttft := first.Sub(start)
			prefilled()
			a.load.observePrefill(ahead, prompt, ttft-slotWait)
			a.load.observeTTFT(ttft)
			a.observedTTFT(h, ttft)
			a.loadChanged()
			traceFirstToken(ctx)
		}
	} else {
		next, err := answerInline(ctx, st, hd, resp.Body, a.inline, &scan)
		if err != nil {
			a.metrics.engineErrors.Inc()
			traceEngineBroke(ctx, err)
		}
		switch next {
		case phaseNoHead:
			return tokens{}
		case phaseEnded:
			return a.settle(&scan, h)
		}
	}
	pool := &a.bufs
	if scan.sse {
		pool = &a.sseBufs
	}
	bp := pool.Get().(*[]byte)
	defer pool.Put(bp)
	ended, err := relayStream(ctx, st, resp.Body, *bp, &scan, onFirst, &a.streamed)
	switch {
	case err != nil:
		a.metrics.engineErrors.Inc()
		traceEngineBroke(ctx, err)
	case ended && !first.IsZero():
		a.load.observeDecode(time.Since(first))
	}
	t := a.settle(&scan, h)
	if cached, ok := scan.Cached(); ok && ended && !first.IsZero() && ahead == 0 {
		if u, ok := uncachedOf(prompt, t.PromptTokens, cached); ok {
			a.load.observePrefillExact(u, first.Sub(start)-slotWait)
		}
	}
	return t
}

// engineRequest builds the engine call: the endpoint checked, the model
// rewritten to the served name or the LoRA adapter, the trace continued.
func (a *Adapter) engineRequest(ctx context.Context, h nats.Header, body []byte) (*http.Request, *subjects.APIError) {
	return a.engineRequestKV(ctx, h, body, nil)
}

// engineRequestKV is engineRequest for a decode leg: kv, when set, is the
// kv_transfer_params written into the body.
func (a *Adapter) engineRequestKV(ctx context.Context, h nats.Header, body, kv []byte) (*http.Request, *subjects.APIError) {
	endpoint, method := h.Get(subjects.HdrEndpoint), h.Get(subjects.HdrMethod)
	if !forwardable(method, endpoint) {
		return nil, subjects.NewError(http.StatusBadRequest, subjects.CodeInvalidRequest, "the adapter does not forward "+strings.TrimSpace(method+" "+strconv.Quote(endpoint)))
	}
	if !a.serves(endpoint) {
		return nil, errNotServed(endpoint)
	}
	var rd io.Reader
	if method == "" {
		method = http.MethodPost
		// kv_transfer_params is the adapters' to write: a client's own
		// would have the engine pull KV blocks from a host it names, or
		// hold blocks nobody pulls. It is the leg's when a prefill leg
		// ran, else null wherever the client wrote it.
		extra := []bodyField{{keys: []string{"kv_transfer_params"}, value: []byte("null"), replaces: true}, a.priorityField(h)}
		if kv != nil {
			extra[0] = bodyField{keys: []string{"kv_transfer_params"}, value: kv}
			ctx = context.WithValue(ctx, pulledKey{}, true)
		}
		b, e := engineBody(answerLimits(endpoint), body, a.servedModel(h), h.Get(subjects.HdrMaxTokens), extra...)
		if e != nil {
			return nil, e
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.cfg.EngineURL+endpoint, rd)
	if err != nil {
		return nil, subjects.NewError(http.StatusBadRequest, subjects.CodeInvalidRequest, err.Error())
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	a.continueTrace(ctx, h, req)
	return req, nil
}

// engineHead sends req and returns the engine's response when it is a
// success to relay; a failure to call, or an engine error status, is
// answered on st here and nil returned.
func (a *Adapter) engineHead(ctx context.Context, st *stream, h nats.Header, req *http.Request) *http.Response {
	resp, _ := a.engineHeadKV(ctx, st, h, req, false)
	return resp
}

// engineHeadKV is engineHead for a request that may be a decode leg
// (pulled): an error status of a decode leg is not answered but reported
// as rejected, so the request can be prefilled here instead.
func (a *Adapter) engineHeadKV(ctx context.Context, st *stream, h nats.Header, req *http.Request, pulled bool) (*http.Response, bool) {
	sent := a.load.clock()
	resp, err := a.client.Do(req)
	traceEngineHead(ctx, resp, err)
	if err != nil {
		a.metrics.requests.WithLabelValues("error").Inc()
		a.metrics.engineErrors.Inc()
		if errors.Is(context.Cause(ctx), errHandover) {
			st.handover()
			return nil, false
		}
		e := callError(ctx, err)
		switch {
		case e.Status == http.StatusServiceUnavailable:
			a.engineUnreachable(err)
		case ctx.Err() == nil:
			// The engine took the request and died working on it: the end
			// says so (Llm-Error), so the gateway can run it elsewhere.
			st.failBroken(e)
			return nil, false
		}
		st.fail(e)
		return nil, false
	}
	a.engineReached(sent)
	a.metrics.requests.WithLabelValues(strconv.Itoa(resp.StatusCode)).Inc()
	if resp.StatusCode < 400 {
		return resp, false
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	if pulled && ctx.Err() == nil {
		a.log.Warn("decode engine refused the prefill's KV parameters", "request", h.Get(subjects.HdrRequestID),
			"status", resp.StatusCode, "body", string(b[:min(len(b), 512)]))
		return nil, true
	}
	if err != nil && len(b) == 0 {
		a.metrics.engineErrors.Inc()
		st.fail(callError(ctx, err))
		return nil, false
	}
	e := engineError(resp.StatusCode, b)
	st.last(a.head(h, resp, "application/json"), e.Body()) // the whole answer is here
	return nil, false
}

// phaseEnd is where a phase left the answer.
type phaseEnd uint8

const (
	phaseNext   phaseEnd = iota // the body goes on: the stream phase relays the rest
	phaseEnded                  // the answer, or its end with an error, is sent: settle the usage
	phaseNoHead                 // the head could not be sent: nothing reached the gateway
)

// answerInline relays a non-streamed answer. It arrives whole when
// generation ends, so head, body and end go back as one message when the
// body fits in limit; a larger one goes as the head and its first part, and
// the stream phase sends the rest. err is the engine's read error, if any.
func answerInline(ctx context.Context, st *stream, hd reply.Frame, body io.Reader, limit int, scan *usageScanner) (phaseEnd, error) {
	b, err := io.ReadAll(io.LimitReader(body, int64(limit)+1))
	if err == nil && len(b) <= limit {
		scan.Write(b)
		st.last(hd, b)
		return phaseEnded, nil
	}
	if st.send(hd) != nil {
		return phaseNoHead, nil
	}
	if len(b) > 0 {
		st.stopKeepalive()
		scan.Write(b)
		if st.send(reply.Frame{Kind: reply.Data, Body: b}) != nil {
			return phaseEnded, nil
		}
	}
	if err != nil {
		endBroken(ctx, st, err)
		return phaseEnded, err
	}
	return phaseNext, nil
}

// relayStream sends body to the gateway one read per message, then the end
// (with Llm-Error when the engine's body broke). onFirst, if set, runs at
// the first byte; streamed, if set, gets the time of every read. It returns
// whether the engine's body ended whole, and the engine's read error; a
// send that fails ends the relay quietly, since
// nobody is left to tell.
func relayStream(ctx context.Context, st *stream, body io.Reader, buf []byte, scan *usageScanner, onFirst func(), streamed *atomic.Int64) (ended bool, err error) {
	first := true
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if first {
				first = false
				st.stopKeepalive()
				if onFirst != nil {
					onFirst()
				}
			}
			if streamed != nil {
				streamed.Store(time.Now().UnixNano())
			}
			scan.Write(buf[:n])
			if st.sendData(buf[:n]) != nil {
				return false, nil
			}
		}
		if err == io.EOF {
			st.end("")
			return true, nil
		}
		if err != nil {
			endBroken(ctx, st, err)
			return false, err
		}
	}
}

// endBroken ends a stream whose engine body broke: handed back to the
// gateway when the drain grace ran out, else with the error.
func endBroken(ctx context.Context, st *stream, err error) {
	if errors.Is(context.Cause(ctx), errHandover) {
		st.handover()
		return
	}
	st.end(streamError(ctx, err))
}

// head builds the head: the engine's status and content type, the route
// headers echoed with this replica, and the engine's retry hints.
func (a *Adapter) head(req nats.Header, resp *http.Response, contentType string) reply.Frame {
	hd := make(nats.Header, 12)
	if contentType != "" {
		hd[subjects.HdrContent] = []string{contentType}
	}
	for k, v := range req {
		if strings.HasPrefix(k, "Llm-Route-") {
			hd[k] = v
		}
	}
	hd[subjects.HdrRouteReplica] = []string{a.cfg.Replica}
	for _, k := range subjects.PassThroughHeaders() {
		if v := resp.Header.Get(k); v != "" {
			hd[k] = []string{v}
		}
	}
	return reply.Frame{Kind: reply.Head, Status: resp.StatusCode, Header: hd}
}

// uncachedOf is the share of a request's prompt its engine did not serve
// from cache (engine prompt tokens, of which cached were), in the units
// brokers count the request's prompt in (its Llm-Prompt-Tokens, prompt),
// as the prefill rate is. ok is false without both counts or with a cached
// count above the engine's prompt.
func uncachedOf(prompt, engine, cached int) (int, bool) {
	if prompt <= 0 || engine <= 0 || cached < 0 || cached > engine {
		return 0, false
	}
	return int(int64(prompt) * int64(engine-cached) / int64(engine)), true
}
