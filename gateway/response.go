package gateway

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/internal/sse"
	"github.com/switchyard-llm/switchyard/internal/stages"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/subjects/reply"
)

// response is the HTTP side of a relayed request, shared by its attempts.
// Until bytes reach the client one attempt can replace another whole; after
// that only a continuation writes on, into the same stream.
type response struct {
	g       *Gateway
	w       http.ResponseWriter
	u       *upstream
	status  int
	sse     bool
	wrote   bool // bytes have reached the client
	held    bool // the stream began while its cold model loaded: no answer in it yet
	buf     bytes.Buffer
	rc      *http.ResponseController
	until   time.Time  // the write deadline last set on rc (renew)
	events  sse.Events // SSE: only whole events are written
	written int        // SSE: events written by the current data or finish call

	// carry follows the answer for a continuation (nil until the head of a
	// stream, or a failure, asks); cont is the continuation's body once
	// one is issued, and model the model the broker routed to.
	carry  *carry
	cont   []byte
	model  string
	failed error // the failure a continuation is resuming from
	// attempt is the request id of the attempt under way: the stage
	// recorder's key.
	attempt string
	// budgetLeft is what is left of the request's budget after its
	// reservation, as its decider's routed notice said ("" when it is
	// under none): every answer carries it.
	budgetLeft string
}

// renew gives the writes that follow WriteTimeout from now, when less
// than three quarters of it remain: every write has at least that long,
// and a stream of many small writes does not move a timer of the poller
// with each (a sixth of a data frame's write at ~1,500 open streams).
func (s *response) renew() {
	now := time.Now()
	if s.until.Sub(now) >= s.g.cfg.WriteTimeout*3/4 {
		return
	}
	s.until = now.Add(s.g.cfg.WriteTimeout)
	_ = s.rc.SetWriteDeadline(s.until)
}

// alive renews a begun stream's write deadline before a write, or while
// its engine is silent (a keepalive came): over HTTP/2 a passed deadline
// resets the stream even with no write waiting.
func (s *response) alive() {
	if s.rc != nil {
		s.renew()
	}
}

// firstByte counts the time to the client's first byte, and stamps it.
func (s *response) firstByte() {
	s.g.metrics.firstByte(s.u, time.Since(s.u.started))
	s.g.cfg.Stages.Mark(s.attempt, stages.ClientFirstByte)
}

// errEngineEvent is an in-band error event from the engine, ending a part
// the relay may resume.
var errEngineEvent = errors.New("the engine reported an error in the stream")

// reset forgets what a failed attempt buffered; a stream already started
// stays one.
func (s *response) reset() {
	if !s.wrote {
		s.status, s.sse = 0, false
	}
	s.buf.Reset()
	s.events.Reset()
}

// following returns the carry, started on first use.
func (s *response) following() *carry {
	if s.carry == nil {
		s.carry = newCarry(s.u, s.g.table.Load(), s.model)
	}
	return s.carry
}

// retryAfter is the Retry-After a replica's frame carries, whole seconds
// up to maxRetryAfter (0: none, or not a number in range).
func retryAfter(h nats.Header) time.Duration {
	n, err := strconv.Atoi(h.Get(subjects.HdrRetryAfter))
	if err != nil || n <= 0 || n > maxRetryAfter {
		return 0
	}
	return time.Duration(n) * time.Second
}

// maxRetryAfter bounds the Retry-After a replica may ask clients to wait,
// in seconds: a day.
const maxRetryAfter = 86400

// rejectionError is the error a rejection's body says, for a stream that
// must end with it as an event.
func rejectionError(f reply.Frame) *subjects.APIError {
	var b subjects.ErrorBody
	_ = json.Unmarshal(f.Body, &b)
	e := &subjects.APIError{Status: cmp.Or(f.Status, 502), Message: b.Error.Message}
	if b.Error.Param != nil {
		e.Param = *b.Error.Param
	}
	switch c := b.Error.Code.(type) {
	case string:
		e.Code = c
	case float64:
		e.Code = strconv.FormatFloat(c, 'f', -1, 64)
	}
	if e.Message == "" {
		e.Message = cmp.Or(string(f.Body), "upstream error "+strconv.Itoa(e.Status))
	}
	return e
}

// passRejection copies a rejection to the client, with its headers.
func (s *response) passRejection(f reply.Frame) {
	hd := s.w.Header()
	for _, k := range subjects.PassThroughHeaders() {
		if v := f.Header.Get(k); v != "" {
			hd.Set(k, v)
		}
	}
	s.g.writeRaw(s.w, s.u, cmp.Or(f.Status, 502), f.Header.Get(subjects.HdrContent), f.Body)
}

// head handles seq 1. refused is set when the replica's engine turned the
// request away (429/503), or a continuation's replica did not continue the
// stream; err when the client could not be written to.
func (s *response) head(f reply.Frame, replica string) (refused, err error) {
	status := cmp.Or(f.Status, 502)
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		// all_replicas_busy is a 503 whatever the engine said: the
		// client's answer is about the replicas, not one engine's 429;
		// the engine's hint goes with it, if retries run out.
		e := errBusy.about(replica, " ("+strconv.Itoa(status)+")")
		e.retryAfter = retryAfter(f.Header)
		return e, nil
	}
	ct := f.Header.Get(subjects.HdrContent)
	if s.wrote && !s.held {
		// A continuation of a stream the client has: it must be one too.
		if status != http.StatusOK || !sse.IsEventStream(ct) {
			return errNotContinued.about(replica, status), nil
		}
		return nil, nil
	}
	s.status = status
	if v := f.Header.Get(subjects.HdrRouteModel); v != "" {
		s.model = v
	}
	if s.held {
		// The 200 and the SSE headers went out when the hold began: the
		// answer goes on in that stream, a non-streamed one whole at its
		// end (finish), an error as the stream's error event (heldError).
		if s.sse = status == http.StatusOK && sse.IsEventStream(ct); s.sse {
			s.held = false
			s.following()
			s.firstByte()
		}
		return nil, nil
	}
	hd := s.w.Header()
	for _, rh := range subjects.RouteHeaders() {
		if v := f.Header.Get(rh[0]); v != "" {
			hd.Set(rh[1], v)
		}
	}
	for _, k := range subjects.PassThroughHeaders() {
		if v := f.Header.Get(k); v != "" {
			hd.Set(k, v)
		}
	}
	if ct != "" {
		hd.Set("Content-Type", ct)
	}
	s.sse = s.u.stream && s.status == http.StatusOK && sse.IsEventStream(ct)
	if !s.sse {
		return nil, nil
	}
	s.startStream()
	s.following()
	s.firstByte()
	return nil, s.rc.Flush()
}

// startStream sends the status and the headers of a server-sent event
// stream (its Content-Type already set): from here on the client has bytes.
func (s *response) startStream() {
	hd := s.w.Header()
	hd.Set("Cache-Control", "no-cache")
	hd.Set("X-Accel-Buffering", "no")
	s.rc = http.NewResponseController(s.w)
	s.renew()
	s.w.WriteHeader(s.status)
	s.wrote = true
}

// data relays one chunk: written and flushed for SSE, buffered otherwise so
// a non-streamed answer can still fail cleanly with an HTTP error.
func (s *response) data(b []byte) error {
	if !s.sse {
		s.buf.Write(b)
		return nil
	}
	s.renew()
	s.written = 0
	err := s.events.Write(b, s.event)
	if s.written == 0 {
		return err
	}
	if ferr := s.rc.Flush(); err == nil {
		err = ferr
	}
	return err
}

// event writes one whole event of the stream, as the carry rewrites it.
func (s *response) event(ev []byte) error {
	out, failed := s.carry.event(ev)
	if failed {
		return errEngineEvent
	}
	if out == nil {
		return nil
	}
	s.written++
	_, err := s.w.Write(out)
	return err
}

// heldError is the rejection a held stream's answer is when its replica
// answered with an error status: the relay ends the stream with it as an
// error event (judge); ok is false for any other answer.
func (s *response) heldError() (f reply.Frame, ok bool) {
	if !s.held || s.status == http.StatusOK {
		return f, false
	}
	s.held = false
	s.firstByte()
	return reply.Frame{Kind: reply.Error, Status: s.status, Body: s.buf.Bytes()}, true
}

// finish completes a whole answer: written at once when buffered.
func (s *response) finish() {
	if s.held {
		// A held stream answered without one (a 200 that is not an
		// event stream): it goes as it came, in the stream begun.
		s.held = false
		s.firstByte()
		s.renew()
		_, _ = s.w.Write(s.buf.Bytes())
		_ = s.rc.Flush()
		s.g.metrics.done(s.u, s.status)
		return
	}
	if !s.sse {
		s.firstByte()
		s.g.writeRaw(s.w, s.u, s.status, "", s.buf.Bytes()) // counts the request
		return
	}
	// The engine may have ended without a blank line after its last
	// event: it is whole all the same.
	s.written = 0
	s.alive()
	if _ = s.events.End(s.event); s.written > 0 {
		_ = s.rc.Flush()
	}
	s.g.metrics.done(s.u, s.status)
}

// endStream ends a stream that bytes already reached with the dialect's
// error event: never a silently truncated answer.
func (s *response) endStream(e *subjects.APIError) {
	s.g.metrics.done(s.u, e.Status)
	s.events.Reset() // an incomplete event is never forwarded
	s.renew()
	_, _ = s.w.Write(s.u.dialect.streamError(e))
	_ = s.rc.Flush()
}

// startHold begins the client's stream as the hold of a cold model begins:
// its 200 and SSE headers go out with the first comment, so what the
// relay writes later goes on in this one stream.
func (s *response) startHold() {
	s.w.Header().Set("Content-Type", "text/event-stream")
	s.held, s.sse, s.status = true, false, http.StatusOK
	s.startStream()
}

// comment writes an SSE comment: proxies see traffic, clients ignore it.
func (s *response) comment(c string) error {
	s.renew()
	if _, err := s.w.Write([]byte(c + "\n\n")); err != nil {
		return err
	}
	return s.rc.Flush()
}
