package gateway

import (
	"bytes"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/internal/sse"
	"github.com/switchyard-llm/switchyard/subjects"
)

// response is the HTTP side of a relayed request, shared by its attempts:
// only one attempt ever writes, since nothing is retried once bytes reached
// the client.
type response struct {
	g      *Gateway
	w      http.ResponseWriter
	u      *upstream
	status int
	sse    bool
	wrote  bool // bytes have reached the client: no more retries
	buf    bytes.Buffer
	rc     *http.ResponseController
}

// reset forgets what a failed attempt buffered.
func (s *response) reset() {
	s.status, s.sse = 0, false
	s.buf.Reset()
}

// rejected copies a broker's or adapter's rejection to the client, or
// returns a refusal to retry when a replica turned the request away while
// draining.
func (s *response) rejected(m *nats.Msg) result {
	status, _ := strconv.Atoi(m.Header.Get(subjects.HdrStatus))
	if status == 0 {
		status = 502
	}
	if rep := m.Header.Get(subjects.HdrRouteReplica); rep != "" && (status == 429 || status == 503) {
		return result{kind: failRefused, replica: rep, ended: true,
			err: &subjects.APIError{Status: status, Code: subjects.CodeAllReplicasBusy, Message: "replica " + rep + " turned the request away"}}
	}
	hd := s.w.Header()
	for _, k := range subjects.PassThroughHeaders() {
		if v := m.Header.Get(k); v != "" {
			hd.Set(k, v)
		}
	}
	s.g.writeRaw(s.w, s.u, status, m.Header.Get(subjects.HdrContent), m.Data)
	return result{ended: true}
}

// head handles seq 1. refused is set when the replica's engine turned the
// request away (429/503); err when the client could not be written to.
func (s *response) head(m *nats.Msg, replica string) (refused *subjects.APIError, err error) {
	s.status, _ = strconv.Atoi(m.Header.Get(subjects.HdrStatus))
	if s.status == 0 {
		s.status = 502
	}
	if s.status == http.StatusTooManyRequests || s.status == http.StatusServiceUnavailable {
		e := &subjects.APIError{Status: s.status, Code: subjects.CodeAllReplicasBusy, Message: "replica " + replica + " turned the request away (" + strconv.Itoa(s.status) + ")"}
		if n, err := strconv.Atoi(m.Header.Get(subjects.HdrRetryAfter)); err == nil && n > 0 {
			e.RetryAfter = time.Duration(n) * time.Second // the engine's hint, if retries run out
		}
		return e, nil
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
	s.sse = s.u.stream && s.status == http.StatusOK && sse.IsEventStream(ct)
	if !s.sse {
		return nil, nil
	}
	hd.Set("Cache-Control", "no-cache")
	hd.Set("X-Accel-Buffering", "no")
	s.rc = http.NewResponseController(s.w)
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.g.cfg.WriteTimeout))
	s.w.WriteHeader(s.status)
	s.wrote = true
	s.g.metrics.firstByte(s.u, time.Since(s.u.started))
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
	if _, err := s.w.Write(b); err != nil {
		return err
	}
	return s.rc.Flush()
}

// finish completes a whole answer: written at once when buffered.
func (s *response) finish() {
	if !s.sse {
		s.g.metrics.firstByte(s.u, time.Since(s.u.started))
		s.g.writeRaw(s.w, s.u, s.status, "", s.buf.Bytes()) // counts the request
		return
	}
	s.g.metrics.done(s.u, s.status)
}

// endStream ends a stream that bytes already reached with the dialect's
// error event: never a silently truncated answer.
func (s *response) endStream(e *subjects.APIError) {
	s.g.metrics.done(s.u, e.Status)
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.g.cfg.WriteTimeout))
	_, _ = s.w.Write(s.u.dialect.streamError(e))
	_ = s.rc.Flush()
}
