package adapter

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/internal/sse"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/subjects/reply"
)

// engineCall is one request's call to the engine, from the engine request
// it builds to the answer it relays on st. serve makes one per request and
// runs it once; its steps share what the call learns on the way.
type engineCall struct {
	a    *Adapter
	ctx  context.Context
	st   *stream
	h    nats.Header
	body []byte

	// rename is the answer's model renaming: the engine names the model
	// as it serves it, the client gets the name it asked for. Zero: the
	// answer goes back as the engine wrote it.
	rename names
	// lora is set when the engine serves the request under a LoRA adapter
	// (Llm-Route-Lora): its 404 for the model is the tenant's adapter
	// missing, not this replica failing (judgeAnswer).
	lora bool
	// kv is the prefill leg's kv_transfer_params: the call is a decode
	// leg. nil: the engine prefills the request itself.
	kv []byte

	// The call's place in the engine's queue (queue): the prompt tokens it
	// adds to the queued prefill, those queued ahead of it and the wait
	// for a batch slot it expects.
	prompt, ahead int
	slotWait      time.Duration
	unqueue       func() // takes the prompt out of the queued prefill, once

	start time.Time      // when the engine request was sent
	first time.Time      // the first byte of a stream: its first token
	resp  *http.Response // the engine's success, relayed by relay
	scan  usageScanner
	began bool // answer bytes went out
	ended bool // the engine's body ended whole
}

// run makes the call and relays the answer. It returns the tokens to
// settle: the engine's usage, an estimate when it reported none, zero when
// the engine did no work.
func (c *engineCall) run() tokens {
	// A split request's prefill leg runs first, elsewhere: the keepalives
	// cover it.
	c.st.startKeepalive(c.a.cfg.KeepaliveEvery)
	c.kv = c.a.prefillLeg(c.ctx, c.h, c.body)
	if c.ctx.Err() != nil {
		c.st.fail(callError(c.ctx, context.Cause(c.ctx)))
		return tokens{}
	}
	req, e := c.request()
	if e != nil {
		c.st.fail(e)
		return tokens{}
	}
	defer c.queue()()
	if !c.send(req) {
		return tokens{}
	}
	defer c.resp.Body.Close()
	if !c.relay() {
		return tokens{}
	}
	return c.settle()
}

// request builds the engine request: the endpoint checked, the model
// rewritten to the served name or the LoRA adapter, kv_transfer_params the
// prefill leg's or none, the trace continued.
func (c *engineCall) request() (*http.Request, *subjects.APIError) {
	a, h := c.a, c.h
	endpoint, method := h.Get(subjects.HdrEndpoint), h.Get(subjects.HdrMethod)
	if !forwardable(method, endpoint) {
		return nil, subjects.NewError(http.StatusBadRequest, subjects.CodeInvalidRequest, "the adapter does not forward "+strings.TrimSpace(method+" "+strconv.Quote(endpoint)))
	}
	if !a.serves(endpoint) {
		return nil, errNotServed(endpoint)
	}
	var rd io.Reader
	var body net.Buffers // a long body's parts, sent as they are
	var n int64          // the body's length
	if method == "" {
		method = http.MethodPost
		// kv_transfer_params is the adapters' to write: a client's own
		// would have the engine pull KV blocks from a host it names, or
		// hold blocks nobody pulls. It is the leg's when a prefill leg
		// ran, else null wherever the client wrote it.
		kv := bodyField{keys: []string{"kv_transfer_params"}, value: []byte("null"), replaces: true}
		if c.kv != nil {
			kv = bodyField{keys: []string{"kv_transfer_params"}, value: c.kv}
		}
		b, e := engineBody(answerLimits(endpoint), c.body, a.servedModel(h), h.Get(subjects.HdrMaxTokens), kv, a.priorityField(h))
		if e != nil {
			return nil, e
		}
		switch n = partsLen(b); {
		case len(b) == 1: // the body as it came
			rd = bytes.NewReader(b[0])
		case n <= joinBelow:
			rd = bytes.NewReader(bytes.Join(b, nil))
		default:
			body = b
			rd = partsReader(body)
		}
	}
	req, err := http.NewRequestWithContext(c.ctx, method, a.cfg.EngineURL+endpoint, rd)
	if err != nil {
		return nil, subjects.NewError(http.StatusBadRequest, subjects.CodeInvalidRequest, err.Error())
	}
	if body != nil {
		// A long body goes out part by part, the prompt read from the
		// request message itself rather than joined into a copy first;
		// its length is known, and a reused connection found dead before
		// any of the request was written may send it again (GetBody).
		req.ContentLength = n
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(partsReader(body)), nil }
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	a.continueTrace(c.ctx, h, req)
	return req, nil
}

// queue counts the call as waiting for its first token: its prompt as
// queued prefill (a split request's prompt was computed by its prefill
// leg; a batch line's at a priority engine waits behind every interactive
// one) and the batch slot wait it expects. It returns the call's exit.
func (c *engineCall) queue() (exit func()) {
	a := c.a
	behind := a.behindInteractive(c.h)
	if c.kv == nil && !behind {
		c.prompt = promptTokens(c.h)
	}
	if behind {
		a.book.batchHeld.Add(1)
	}
	c.unqueue, c.ahead = a.load.queuePrefill(c.prompt)
	c.slotWait = a.slotWait(behind)
	a.loadChanged()
	return func() {
		c.unqueue()
		if behind {
			a.book.batchHeld.Add(-1)
		}
	}
}

// send sends req and keeps the engine's success in c.resp. A decode leg
// the engine refuses (the prefill's blocks expired or unknown) is sent
// again without the leg's parameters: the engine prefills it itself. It
// reports whether there is an answer to relay; when not, st has its end.
func (c *engineCall) send(req *http.Request) bool {
	c.start = time.Now()
	resp, refused := c.do(req)
	if refused {
		c.a.servedWhole(c.h, wholeDecodeRejected)
		c.kv = nil
		var e *subjects.APIError
		if req, e = c.request(); e != nil {
			c.st.fail(e)
			return false
		}
		c.start = time.Now()
		resp, _ = c.do(req)
	}
	c.resp = resp
	return resp != nil
}

// do sends req and returns the engine's response when it is a success
// to relay, its model renamed. A failure to call, or an engine error
// status, is answered on st and nil returned; a decode leg's error status
// is not answered but reported as refused, so the request can be
// prefilled here instead.
func (c *engineCall) do(req *http.Request) (_ *http.Response, refused bool) {
	a := c.a
	sent := a.load.clock()
	resp, err := a.engine.client.Do(req)
	resp = a.engine.judgeAnswer(req, resp, err, c.lora, c.kv != nil)
	traceEngineHead(c.ctx, resp, err)
	if err != nil {
		c.callFailed(err)
		return nil, false
	}
	a.engineReached(sent)
	a.metrics.requests.WithLabelValues(strconv.Itoa(resp.StatusCode)).Inc()
	if resp.StatusCode >= 400 {
		return nil, c.answerError(resp)
	}
	c.rename.apply(resp)
	return resp, false
}

// callFailed answers a call that got no answer from the engine: handed
// back when the drain grace ran out, else the error, with Llm-Error when
// the engine took the request and died working on it.
func (c *engineCall) callFailed(err error) {
	a, ctx := c.a, c.ctx
	a.metrics.requests.WithLabelValues("error").Inc()
	a.metrics.engineErrors.Inc()
	if errors.Is(context.Cause(ctx), errHandover) {
		c.st.handover()
		return
	}
	e := callError(ctx, err)
	switch {
	case e.Status == http.StatusServiceUnavailable:
		a.engineUnreachable(err)
	case ctx.Err() == nil:
		// The end says so (Llm-Error), so the gateway can run it
		// elsewhere.
		c.st.failBroken(e)
		return
	}
	c.st.fail(e)
}

// answerError answers the engine's error status with its error, the
// whole answer in one message, and closes resp. A decode leg's is not
// answered but reported as refused.
func (c *engineCall) answerError(resp *http.Response) (refused bool) {
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	if c.kv != nil && c.ctx.Err() == nil {
		c.a.log.Warn("decode engine refused the prefill's KV parameters", "request", c.h.Get(subjects.HdrRequestID),
			"status", resp.StatusCode, "body", string(b[:min(len(b), 512)]))
		return true
	}
	if err != nil && len(b) == 0 {
		c.a.metrics.engineErrors.Inc()
		c.st.fail(callError(c.ctx, err))
		return false
	}
	e := engineError(resp.StatusCode, b)
	c.st.last(c.headFrame(resp, "application/json"), e.Body())
	return false
}

// relay sends the head and the body. It reports whether the head went
// out.
func (c *engineCall) relay() bool {
	ct := c.resp.Header.Get("Content-Type")
	hd := c.headFrame(c.resp, ct)
	c.scan = usageScanner{sse: sse.IsEventStream(ct)}
	if rec := c.a.newOwnerRecorder(c.h); rec != nil {
		c.scan.observe = func(p []byte) { rec.observe(c.ctx, p) }
	}
	c.a.forgetDeleted(c.ctx, c.h, c.resp.StatusCode)
	if !c.scan.sse {
		return c.relayWhole(hd)
	}
	if c.st.send(hd) != nil {
		return false
	}
	c.relayBody()
	return true
}

// relayWhole relays a non-streamed answer. It arrives whole when
// generation ends, so head, body and end go back as one message when the
// body fits in one, else as the head, its first part and the rest read by
// read.
func (c *engineCall) relayWhole(hd reply.Frame) bool {
	inline := c.a.engine.inline
	b, err := io.ReadAll(io.LimitReader(c.resp.Body, int64(inline)+1))
	if err == nil && len(b) <= inline {
		c.scan.Write(b)
		c.st.last(hd, b)
		return true
	}
	if c.st.send(hd) != nil {
		return false
	}
	if c.relayRead(b) && !c.broke(err) {
		c.relayBody()
	}
	return true
}

// relayBody relays the rest of the engine's body, one read per message,
// then the end.
func (c *engineCall) relayBody() {
	pool := &c.a.engine.bufs
	if c.scan.sse {
		pool = &c.a.engine.sseBufs
	}
	bp := pool.Get().(*[]byte)
	defer pool.Put(bp)
	for {
		n, err := c.resp.Body.Read(*bp)
		switch {
		case !c.relayRead((*bp)[:n]):
			return
		case err == io.EOF:
			c.st.end("")
			c.ended = true
			if !c.first.IsZero() {
				c.a.load.observeDecode(time.Since(c.first))
			}
			return
		case c.broke(err):
			return
		}
	}
}

// relayRead sends one engine read to the gateway; the first byte of a
// stream is its first token. It reports whether the relay goes on: a send
// that fails ends it quietly, since nobody is left to tell.
func (c *engineCall) relayRead(b []byte) bool {
	if len(b) == 0 {
		return true
	}
	if !c.began {
		c.began = true
		c.st.stopKeepalive()
		if c.scan.sse {
			c.firstToken()
		}
	}
	c.a.engine.streamed.Store(time.Now().UnixNano())
	c.scan.Write(b)
	return c.st.sendData(b) == nil
}

// broke ends the answer when the engine's body broke (err, a read error):
// handed back to the gateway when the drain grace ran out, else with the
// error. It reports whether it did.
func (c *engineCall) broke(err error) bool {
	if err == nil {
		return false
	}
	c.a.metrics.engineErrors.Inc()
	traceEngineBroke(c.ctx, err)
	if errors.Is(context.Cause(c.ctx), errHandover) {
		c.st.handover()
	} else {
		c.st.end(streamError(c.ctx, err))
	}
	return true
}

// firstToken learns from a stream's first token: the time to it, and the
// prefill rate its queued prompt tokens took. Only a stream's first byte is
// one: a non-streamed body arrives when generation is over.
func (c *engineCall) firstToken() {
	a := c.a
	c.first = time.Now()
	ttft := c.first.Sub(c.start)
	c.unqueue()
	a.load.observePrefill(c.ahead, c.prompt, ttft-c.slotWait)
	a.load.observeTTFT(ttft)
	a.observedTTFT(c.h, ttft)
	a.loadChanged()
	traceFirstToken(c.ctx)
}

// settle returns the tokens the answer used: the engine's usage, or an
// estimate (the gateway's prompt estimate and, for a stream, one token per
// data event). It learns the exact prefill rate from a stream that ended
// whole with nothing queued ahead of it, when the engine said what its
// cache served.
func (c *engineCall) settle() tokens {
	t, ok := c.scan.Finish()
	cached, hasCached := c.scan.Cached()
	switch {
	case ok && hasCached:
		t.Cached = min(max(cached, 0), t.PromptTokens)
	case !ok:
		prompt, _ := strconv.Atoi(c.h.Get(subjects.HdrPromptTokens))
		t = tokens{PromptTokens: prompt, CompletionTokens: c.scan.events}
	}
	if hasCached && c.ended && !c.first.IsZero() && c.ahead == 0 {
		if u, ok := uncachedOf(c.prompt, t.PromptTokens, cached); ok {
			c.a.load.observePrefillExact(u, c.first.Sub(c.start)-c.slotWait)
		}
	}
	return t
}

// headFrame is the head: the engine's status and content type, the route
// headers echoed with this replica, and the engine's retry hints.
func (c *engineCall) headFrame(resp *http.Response, contentType string) reply.Frame {
	hd := make(nats.Header, 12)
	if contentType != "" {
		hd[subjects.HdrContent] = []string{contentType}
	}
	for k, v := range c.h {
		if strings.HasPrefix(k, "Llm-Route-") {
			hd[k] = v
		}
	}
	hd[subjects.HdrRouteReplica] = []string{c.a.cfg.Replica}
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
