package gateway

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/switchyard-llm/switchyard/subjects"
)

// upstream is one request on its way through NATS.
type upstream struct {
	tenant   string
	endpoint string
	model    string
	stream   bool
	body     []byte
	hdr      nats.Header // request headers, shared by every attempt
	clientID string      // X-Request-Id from the client, echoed back
	deadline time.Time
	exclude  []string
	started  time.Time
}

// outcome of one attempt.
type outcome int

const (
	done      outcome = iota // the client got its answer (or an error it can see)
	retryable                // nothing reached the client; another replica may serve it
)

// relay sends the request through brokers, retrying before the first byte.
func (g *Gateway) relay(w http.ResponseWriter, r *http.Request, u *upstream) {
	g.budget.active.Add(1)
	defer g.budget.active.Add(-1)
	ctx, cancel := context.WithDeadline(r.Context(), u.deadline)
	defer cancel()
	var last *subjects.APIError
	for attempt := 0; ; attempt++ {
		if ctx.Err() != nil {
			// The client left or the deadline passed: a new attempt would
			// only start an engine call nobody waits for.
			break
		}
		if !g.nc.IsConnected() {
			// Published now, the request would wait in the reconnect buffer
			// and reach a replica after the client gave up: say so instead.
			last = subjects.NewError(503, subjects.CodeRouterUnavailable, "the gateway is not connected to NATS")
			last.RetryAfter = time.Second
			break
		}
		if attempt > 0 {
			if attempt > g.cfg.MaxRetries || !g.budget.acquire() {
				break
			}
			g.metrics.retries.Inc()
			res, err := g.attempt(ctx, w, u)
			g.budget.release()
			if res == done {
				return
			}
			last = err
			continue
		}
		res, err := g.attempt(ctx, w, u)
		if res == done {
			return
		}
		last = err
	}
	if ctx.Err() != nil && r.Context().Err() == nil {
		last = subjects.NewError(http.StatusGatewayTimeout, subjects.CodeUpstreamTimeout, "the request deadline passed before a replica answered")
	}
	g.fail(w, u, last)
}

// attempt makes one try. It returns retryable only when nothing has been
// written to the client.
func (g *Gateway) attempt(ctx context.Context, w http.ResponseWriter, u *upstream) (outcome, *subjects.APIError) {
	id := nuid.Next()
	c := g.disp.register(id)
	defer g.disp.unregister(id)

	h := make(nats.Header, len(u.hdr)+2)
	for k, v := range u.hdr {
		h[k] = v
	}
	h[subjects.HdrRequestID] = []string{id}
	if len(u.exclude) > 0 {
		h[subjects.HdrExclude] = []string{strings.Join(u.exclude, ",")}
	}
	msg := &nats.Msg{Subject: g.subj.Route(u.tenant), Reply: g.replyPfx + id, Header: h, Data: u.body}
	if err := g.nc.PublishMsg(msg); err != nil {
		return retryable, subjects.NewError(503, subjects.CodeRouterUnavailable, "NATS unavailable: "+err.Error())
	}

	// Phase 1: the accept (or a rejection) within the accept timeout.
	timer := time.NewTimer(g.cfg.AcceptTimeout)
	defer timer.Stop()
	var replica, routed string
	var combined *nats.Msg
	for replica == "" {
		select {
		case <-ctx.Done():
			return g.gone(ctx, w, u, routed, id)
		case <-c.overflow:
			if routed != "" {
				g.cancelUpstream(routed, id)
			}
			g.fail(w, u, subjects.NewError(502, subjects.CodeUpstreamError, "the reply overflowed before the replica accepted"))
			return done, nil
		case <-c.lost:
			if routed != "" {
				g.cancelUpstream(routed, id)
			}
			return retryable, lostConnection()
		case <-timer.C:
			if routed == "" {
				return retryable, subjects.NewError(http.StatusGatewayTimeout, subjects.CodeUpstreamTimeout, "no broker routed the request in time")
			}
			// The broker chose a replica that did not accept: leave it out
			// of the retry, and stop it in case it was only slow.
			g.cancelUpstream(routed, id)
			u.exclude = append(u.exclude, routed)
			g.metrics.acceptTimeouts.Inc()
			return retryable, subjects.NewError(http.StatusGatewayTimeout, subjects.CodeUpstreamTimeout, "replica "+routed+" did not accept the request in time")
		case m := <-c.ch:
			if r := m.Header.Get(subjects.HdrRouted); r != "" {
				routed = r
				continue
			}
			if m.Header.Get("Status") == "503" && len(m.Data) == 0 {
				// NATS no-responders: no broker is listening.
				return retryable, subjects.NewError(503, subjects.CodeRouterUnavailable, "no broker is available")
			}
			if a := m.Header.Get(subjects.HdrAccepted); a != "" {
				replica = a
				if m.Header.Get(subjects.HdrStatus) != "" {
					// The accept rode on the head: the engine answered
					// before the adapter's accept delay ran out.
					combined = m
				}
				break
			}
			if m.Header.Get(subjects.HdrEOS) != "" {
				return g.rejected(w, u, m)
			}
		}
	}

	// Phase 2: head, data, end, each in sequence, with keepalives resetting
	// the idle timer.
	rel := relayState{g: g, w: w, u: u, replica: replica, next: 1}
	timer.Reset(g.cfg.IdleTimeout)
	if combined != nil {
		if res, apiErr, stop := rel.onMsg(combined, timer, id); stop {
			return res, apiErr
		}
	}
	for {
		select {
		case <-ctx.Done():
			if rel.wrote {
				return g.goneAfter(ctx, &rel, id)
			}
			return g.gone(ctx, w, u, replica, id)
		case <-c.lost:
			g.cancelUpstream(replica, id)
			g.metrics.streamErrors.WithLabelValues("nats_disconnect").Inc()
			return rel.failMidway(lostConnection())
		case <-c.overflow:
			g.cancelUpstream(replica, id)
			g.metrics.streamErrors.WithLabelValues("slow_client").Inc()
			return rel.failMidway(subjects.NewError(502, subjects.CodeUpstreamError, "the client read too slowly; the stream was cut"))
		case <-timer.C:
			g.cancelUpstream(replica, id)
			g.metrics.streamErrors.WithLabelValues("idle_timeout").Inc()
			return rel.failMidway(subjects.NewError(http.StatusGatewayTimeout, subjects.CodeUpstreamTimeout, "replica "+replica+" went silent"))
		case m := <-c.ch:
			if res, apiErr, stop := rel.onMsg(m, timer, id); stop {
				return res, apiErr
			}
		}
	}
}

// onMsg handles one reply message after the accept: the head, data and end,
// in Llm-Seq order. stop reports that the attempt is over.
func (s *relayState) onMsg(m *nats.Msg, timer *time.Timer, id string) (outcome, *subjects.APIError, bool) {
	g, replica := s.g, s.replica
	if m.Header.Get(subjects.HdrRouted) != "" {
		return done, nil, false // the broker's notice, overtaken by the accept
	}
	if m.Header.Get(subjects.HdrKeepalive) != "" {
		// A keepalive repeats the last seq sent: slow, not dead.
		resetTimer(timer, g.cfg.IdleTimeout)
		return done, nil, false
	}
	seq, err := strconv.Atoi(m.Header.Get(subjects.HdrSeq))
	if err != nil || seq != s.next {
		g.cancelUpstream(replica, id)
		g.metrics.streamErrors.WithLabelValues("sequence_gap").Inc()
		res, e := s.failMidway(subjects.NewError(502, subjects.CodeUpstreamError, "reply from "+replica+" lost a message (sequence gap)"))
		return res, e, true
	}
	s.next++
	resetTimer(timer, g.cfg.IdleTimeout)
	if seq == 1 {
		if res, apiErr, stop := s.head(m); stop {
			switch {
			case res == retryable:
				g.cancelUpstream(replica, id)
				s.u.exclude = append(s.u.exclude, replica)
			case m.Header.Get(subjects.HdrEOS) == "":
				// The client went away as the head was flushed: stop the engine.
				g.cancelUpstream(replica, id)
				g.metrics.clientGone.Inc()
			}
			return res, apiErr, true
		}
		// A head may carry the body and the end too: a non-streamed answer,
		// or an adapter that failed before the engine answered.
	}
	if len(m.Data) > 0 {
		if err := s.data(m.Data); err != nil {
			// The client stopped reading (the write deadline passed)
			// or went away: only its own stream ends.
			g.cancelUpstream(replica, id)
			g.metrics.streamErrors.WithLabelValues("slow_client").Inc()
			return done, nil, true
		}
	}
	if m.Header.Get(subjects.HdrEOS) != "" {
		res, e := s.end(m.Header.Get(subjects.HdrError))
		return res, e, true
	}
	return done, nil, false
}

// lostConnection is the error of a request whose replies may have been lost
// with the NATS connection.
func lostConnection() *subjects.APIError {
	e := subjects.NewError(503, subjects.CodeRouterUnavailable, "the gateway lost its NATS connection while the request was in flight")
	e.RetryAfter = time.Second
	return e
}

// rejected copies a broker's or adapter's rejection to the client, or asks
// for a retry when a replica turned the request away while draining.
func (g *Gateway) rejected(w http.ResponseWriter, u *upstream, m *nats.Msg) (outcome, *subjects.APIError) {
	status, _ := strconv.Atoi(m.Header.Get(subjects.HdrStatus))
	if status == 0 {
		status = 502
	}
	if rep := m.Header.Get(subjects.HdrRouteReplica); rep != "" && (status == 429 || status == 503) {
		u.exclude = append(u.exclude, rep)
		return retryable, &subjects.APIError{Status: status, Code: subjects.CodeAllReplicasBusy, Message: "replica " + rep + " turned the request away"}
	}
	hd := w.Header()
	for _, k := range subjects.PassThroughHeaders() {
		if v := m.Header.Get(k); v != "" {
			hd.Set(k, v)
		}
	}
	g.writeRaw(w, u, status, m.Header.Get(subjects.HdrContent), m.Data)
	return done, nil
}

// gone handles a client that went away or a deadline that passed before
// anything was written.
func (g *Gateway) gone(ctx context.Context, w http.ResponseWriter, u *upstream, replica, id string) (outcome, *subjects.APIError) {
	if replica != "" {
		g.cancelUpstream(replica, id)
	}
	if ctx.Err() == context.DeadlineExceeded {
		g.fail(w, u, subjects.NewError(http.StatusGatewayTimeout, subjects.CodeUpstreamTimeout, "the request deadline passed"))
		return done, nil
	}
	g.metrics.clientGone.Inc()
	return done, nil
}

func (g *Gateway) goneAfter(ctx context.Context, rel *relayState, id string) (outcome, *subjects.APIError) {
	g.cancelUpstream(rel.replica, id)
	if ctx.Err() == context.DeadlineExceeded {
		return rel.failMidway(subjects.NewError(http.StatusGatewayTimeout, subjects.CodeUpstreamTimeout, "the request deadline passed"))
	}
	g.metrics.clientGone.Inc()
	return done, nil
}

// cancelUpstream tells the adapter to stop the engine call.
func (g *Gateway) cancelUpstream(replica, id string) {
	m := nats.NewMsg(g.subj.ReplicaCancel(replica))
	m.Header.Set(subjects.HdrRequestID, id)
	_ = g.nc.PublishMsg(m)
}

// relayState is the HTTP side of one accepted attempt.
type relayState struct {
	g       *Gateway
	w       http.ResponseWriter
	u       *upstream
	replica string
	next    int
	status  int
	sse     bool
	wrote   bool // bytes have reached the client: no more retries
	buf     bytes.Buffer
	rc      *http.ResponseController
}

// head handles seq 1. stop reports whether the attempt ends here.
func (s *relayState) head(m *nats.Msg) (outcome, *subjects.APIError, bool) {
	s.status, _ = strconv.Atoi(m.Header.Get(subjects.HdrStatus))
	if s.status == 0 {
		s.status = 502
	}
	if s.status == http.StatusTooManyRequests || s.status == http.StatusServiceUnavailable {
		e := &subjects.APIError{Status: s.status, Code: subjects.CodeAllReplicasBusy, Message: "replica " + s.replica + " turned the request away (" + strconv.Itoa(s.status) + ")"}
		if n, err := strconv.Atoi(m.Header.Get(subjects.HdrRetryAfter)); err == nil && n > 0 {
			e.RetryAfter = time.Duration(n) * time.Second // the engine's hint, if retries run out
		}
		return retryable, e, true
	}
	hd := s.w.Header()
	for _, rh := range subjects.RouteHeaders() {
		if v := m.Header.Get(rh[0]); v != "" {
			hd.Set(rh[1], v)
		}
	}
	for _, k := range subjects.PassThroughHeaders() {
		if v := m.Header.Get(k); v != "" {
			hd.Set(k, v)
		}
	}
	ct := m.Header.Get(subjects.HdrContent)
	if ct != "" {
		hd.Set("Content-Type", ct)
	}
	s.g.setRequestID(hd, s.u)
	s.sse = s.u.stream && s.status == http.StatusOK && strings.HasPrefix(ct, "text/event-stream")
	if s.sse {
		hd.Set("Cache-Control", "no-cache")
		hd.Set("X-Accel-Buffering", "no")
		s.rc = http.NewResponseController(s.w)
		_ = s.rc.SetWriteDeadline(time.Now().Add(s.g.cfg.WriteTimeout))
		s.w.WriteHeader(s.status)
		s.wrote = true
		s.g.metrics.firstByte(s.u, time.Since(s.u.started))
		if err := s.rc.Flush(); err != nil {
			return done, nil, true
		}
	}
	return done, nil, false
}

// data relays one chunk: written and flushed for SSE, buffered otherwise so
// a non-streamed answer can still fail cleanly with 502.
func (s *relayState) data(b []byte) error {
	if !s.sse {
		s.buf.Write(b)
		return nil
	}
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.g.cfg.WriteTimeout))
	if _, err := s.w.Write(b); err != nil {
		return err
	}
	return s.rc.Flush()
}

// end closes the response: whole for a buffered answer, or an explicit
// error when the engine failed mid-way.
func (s *relayState) end(engineErr string) (outcome, *subjects.APIError) {
	if engineErr != "" {
		s.g.metrics.streamErrors.WithLabelValues("engine").Inc()
		return s.failMidway(subjects.NewError(502, subjects.CodeUpstreamError, "engine failed mid-response: "+engineErr))
	}
	if !s.sse {
		s.g.metrics.firstByte(s.u, time.Since(s.u.started))
		s.g.writeRaw(s.w, s.u, s.status, "", s.buf.Bytes()) // counts the request
		return done, nil
	}
	s.g.metrics.done(s.u, s.status)
	return done, nil
}

// failMidway ends the response with an explicit error: a 502/504 when
// nothing was written yet, an SSE error event after that. Never a silently
// truncated answer.
func (s *relayState) failMidway(e *subjects.APIError) (outcome, *subjects.APIError) {
	if !s.wrote {
		s.g.fail(s.w, s.u, e)
		return done, nil
	}
	s.g.metrics.done(s.u, e.Status)
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.g.cfg.WriteTimeout))
	_, _ = s.w.Write([]byte("event: error\ndata: "))
	_, _ = s.w.Write(e.Body())
	_, _ = s.w.Write([]byte("\n\n"))
	_ = s.rc.Flush()
	return done, nil
}

func resetTimer(t *time.Timer, d time.Duration) {
	// Since Go 1.23 Reset on an unstopped timer discards a stale value.
	t.Reset(d)
}
