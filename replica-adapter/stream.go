package adapter

import (
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/subjects"
)

// stream is one request's side of the reply protocol: it numbers the
// messages (accept 0, head 1, data 2…, end) and sends keepalives while the
// engine has not produced its first body byte.
//
// A keepalive repeats the Llm-Seq of the last message sent and does not
// advance the sequence (see subjects.HdrKeepalive), so the head is seq 1 and
// the data start at seq 2 however long the prefill. The mutex keeps a
// keepalive from slipping between a message's numbering and its publish.
type stream struct {
	nc    *nats.Conn
	reply string

	mu    sync.Mutex
	next  int   // Llm-Seq of the next message
	err   error // the first publish error; nothing is sent after it
	ended bool
	ka    *time.Timer
	kaOn  bool
	every time.Duration
}

// send publishes the next message of the sequence. h may be nil.
func (s *stream) send(h nats.Header, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sendLocked(h, data)
}

// Lock should be held.
func (s *stream) sendLocked(h nats.Header, data []byte) error {
	if s.err != nil || s.ended {
		return s.err
	}
	if h == nil {
		h = make(nats.Header, 1)
	}
	h[subjects.HdrSeq] = []string{strconv.Itoa(s.next)}
	s.next++
	s.err = s.nc.PublishMsg(&nats.Msg{Subject: s.reply, Header: h, Data: data})
	return s.err
}

// end sends the end of the stream, with Llm-Error when errText is set.
func (s *stream) end(errText string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopKeepaliveLocked()
	h := nats.Header{subjects.HdrEOS: {"1"}}
	if errText != "" {
		h[subjects.HdrError] = []string{errText}
	}
	_ = s.sendLocked(h, nil)
	s.ended = true
}

// fail answers with a single head that is also the end, carrying the status
// and the OpenAI error body: the shape of a rejection, after the accept.
func (s *stream) fail(e *subjects.APIError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopKeepaliveLocked()
	h := errorHeader(s.next, e)
	_ = s.sendLocked(h, e.Body())
	s.ended = true
}

func (s *stream) startKeepalive(every time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.every, s.kaOn = every, true
	s.ka = time.AfterFunc(every, s.keepalive)
}

// keepalive runs on the timer. It re-arms the timer only while keepalives
// are on, under the mutex, so a stopped stream's timer stays stopped.
func (s *stream) keepalive() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.kaOn || s.err != nil || s.ended {
		return
	}
	seq := max(s.next-1, 0)
	s.err = s.nc.PublishMsg(&nats.Msg{Subject: s.reply, Header: nats.Header{
		subjects.HdrSeq:       {strconv.Itoa(seq)},
		subjects.HdrKeepalive: {"1"},
	}})
	s.ka.Reset(s.every)
}

func (s *stream) stopKeepalive() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopKeepaliveLocked()
}

// Lock should be held.
func (s *stream) stopKeepaliveLocked() {
	if s.kaOn {
		s.kaOn = false
		s.ka.Stop()
	}
}
