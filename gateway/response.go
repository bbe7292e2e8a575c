package gateway

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

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
	events  sse.Events // SSE: only whole events are written
	written int        // SSE: events written by the current data or finish call

	// carry follows the answer for a continuation (nil until the head of a
	// stream, or a failure, asks); cont is the continuation's body once
	// one is issued, and model the model the broker routed to.
	carry  *carry
	cont   []byte
	model  string
	failed *subjects.APIError // the failure a continuation is resuming from
	// attempt is the request id of the attempt under way: the stage
	// recorder's key.
	attempt string
	// budgetLeft is what is left of the request's budget after its
	// reservation, as its decider's routed notice said ("" when it is
	// under none): every answer carries it.
	budgetLeft string
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

// rejection is the result of a broker's or adapter's rejection: a refusal
// to retry when a replica turned the request away while draining, the
// failure a continuation resumed from when no broker could place it, else
// the rejection for the client.
func (s *response) rejection(f reply.Frame) result {
	status := cmp.Or(f.Status, 502)
	if rep := f.Header.Get(subjects.HdrRouteReplica); rep != "" && (status == 429 || status == 503) {
		// A replica with no room says all_replicas_busy; one draining
		// says no_replicas, and is not asked again (settle).
		code := subjects.CodeAllReplicasBusy
		if rejectionError(f).Code == subjects.CodeNoReplicas {
			code = subjects.CodeNoReplicas
		}
		e := &subjects.APIError{Status: http.StatusServiceUnavailable, Code: code, Message: "replica " + rep + " turned the request away"}
		if n, err := strconv.Atoi(f.Header.Get(subjects.HdrRetryAfter)); err == nil && n > 0 {
			e.RetryAfter = time.Duration(n) * time.Second
		}
		return result{kind: failRefused, replica: rep, ended: true, err: e}
	}
	if s.cont != nil {
		// A continuation no broker could place (no other replica): the
		// client gets the failure it would have had without one.
		s.g.log.Info("cannot resume", "why", cmp.Or(rejectionError(f).Message, "status "+strconv.Itoa(status)))
		e := s.failed
		if e == nil {
			e = subjects.NewError(502, subjects.CodeUpstreamError, "the answer could not continue on another replica")
		}
		return result{kind: failUnplaced, ended: true, err: e}
	}
	return result{kind: failRejected, ended: true, rejection: &f, err: rejectionError(f)}
}

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
// request away (429/503); err when the client could not be written to.
func (s *response) head(f reply.Frame, replica string) (refused *subjects.APIError, err error) {
	status := cmp.Or(f.Status, 502)
	if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
		// all_replicas_busy is a 503 whatever the engine said: the
		// client's answer is about the replicas, not one engine's 429.
		e := &subjects.APIError{Status: http.StatusServiceUnavailable, Code: subjects.CodeAllReplicasBusy, Message: "replica " + replica + " turned the request away (" + strconv.Itoa(status) + ")"}
		if n, err := strconv.Atoi(f.Header.Get(subjects.HdrRetryAfter)); err == nil && n > 0 {
			e.RetryAfter = time.Duration(n) * time.Second // the engine's hint, if retries run out
		}
		return e, nil
	}
	ct := f.Header.Get(subjects.HdrContent)
	if s.wrote && !s.held {
		// A continuation of a stream the client has: it must be one too.
		if status != http.StatusOK || !sse.IsEventStream(ct) {
			return subjects.NewError(502, subjects.CodeUpstreamError, "replica "+replica+" did not continue the stream (status "+strconv.Itoa(status)+")"), nil
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
		// end (finish).
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
	hd.Set("Cache-Control", "no-cache")
	hd.Set("X-Accel-Buffering", "no")
	s.rc = http.NewResponseController(s.w)
	s.following()
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.g.cfg.WriteTimeout))
	s.w.WriteHeader(s.status)
	s.wrote = true
	s.firstByte()
	return nil, s.rc.Flush()
}

// data relays one chunk: written and flushed for SSE, buffered otherwise so
// a non-streamed answer can still fail cleanly with an HTTP error.
func (s *response) data(b []byte) error {
	if !s.sse {
		s.buf.Write(b)
		return nil
	}
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.g.cfg.WriteTimeout))
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

// finish completes a whole answer: written at once when buffered.
func (s *response) finish() {
	if s.held {
		// A held stream answered without one: an error becomes the
		// stream's error event, anything else goes as it came.
		s.held = false
		s.firstByte()
		if s.status != http.StatusOK {
			s.endStream(rejectionError(reply.Frame{Status: s.status, Body: s.buf.Bytes()}))
			return
		}
		_ = s.rc.SetWriteDeadline(time.Now().Add(s.g.cfg.WriteTimeout))
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
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.g.cfg.WriteTimeout))
	_, _ = s.w.Write(s.u.dialect.streamError(e))
	_ = s.rc.Flush()
}

// startHold begins the client's stream as the hold of a cold model begins:
// its 200 and SSE headers go out with the first comment, so what the
// relay writes later goes on in this one stream.
func (s *response) startHold() {
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	s.w.WriteHeader(http.StatusOK)
	s.rc = http.NewResponseController(s.w)
	s.wrote, s.held, s.sse, s.status = true, true, false, http.StatusOK
}

// comment writes an SSE comment: proxies see traffic, clients ignore it.
func (s *response) comment(c string) error {
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.g.cfg.WriteTimeout))
	if _, err := s.w.Write([]byte(c + "\n\n")); err != nil {
		return err
	}
	return s.rc.Flush()
}
