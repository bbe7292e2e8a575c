package adapter

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/internal/stages"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/subjects/reply"
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

	// The accept waits up to the accept delay to ride on the head; replica
	// names it, and acceptBody is its body when it goes alone
	// (acceptBody). acceptTimer sends it alone if the head is late.
	replica       string
	acceptBody    []byte
	acceptPending bool
	acceptTimer   *time.Timer
	armed         time.Time // when the accept was armed: Llm-Held counts from it

	mu    sync.Mutex
	data  nats.Header // reused by every data message (see sendData)
	next  int         // Llm-Seq of the next message
	err   error       // the first publish error; nothing is sent after it
	ended bool
	// broke is set when the stream ended unfinished (an engine failure, a
	// handover, a cancel): the gateway may continue the answer elsewhere.
	broke bool
	ka    *time.Timer
	kaOn  bool
	every time.Duration

	// stages records when the first answer bytes went out (nil: this
	// request is not sampled); id is its key.
	stages *stages.Recorder
	id     string
}

// published stamps the first answer bytes published. Lock should be held.
func (s *stream) published() {
	if s.stages != nil && s.err == nil {
		s.stages.Mark(s.id, stages.AdapterFirstChunk)
		s.stages = nil
	}
}

// send publishes f as the next message of the sequence.
func (s *stream) send(f reply.Frame) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sendLocked(f)
}

// sendData publishes one data message: the bytes of one engine read. It
// is the per-chunk path, so it reuses the stream's header map (PublishMsg
// has encoded it by the time it returns) rather than allocate one a chunk.
func (s *stream) sendData(data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.acceptPending || s.err != nil || s.ended {
		return s.sendLocked(reply.Frame{Kind: reply.Data, Body: data})
	}
	if s.data == nil {
		s.data = make(nats.Header, 1)
	}
	f := reply.Frame{Kind: reply.Data, Seq: s.next, Header: s.data, Body: data}
	s.next++
	s.err = s.nc.PublishMsg(f.Msg(s.reply))
	s.published()
	return s.err
}

// Lock should be held.
func (s *stream) sendLocked(f reply.Frame) error {
	if s.err != nil || s.ended {
		return s.err
	}
	if s.acceptPending {
		if f.Kind == reply.Head {
			// The head carries the accept: seq 0 is never sent alone.
			s.acceptPending = false
			s.acceptTimer.Stop()
			f.Replica, f.Held = s.replica, time.Since(s.armed)
			s.next = 1
		} else if err := s.sendAcceptLocked(); err != nil {
			return err
		}
	}
	f.Seq = s.next
	s.next++
	s.err = s.nc.PublishMsg(f.Msg(s.reply))
	if f.Kind == reply.Head {
		s.published()
	}
	return s.err
}

// accept sends the accept now (delay ≤ 0), or arms it to go after delay
// unless a head goes first and carries it; body is its body, should it go
// alone.
func (s *stream) accept(replica string, body []byte, delay time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.replica, s.acceptBody, s.armed = replica, body, time.Now()
	if delay <= 0 {
		return s.sendAcceptLocked()
	}
	s.acceptPending = true
	s.acceptTimer = time.AfterFunc(delay, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.acceptPending {
			_ = s.sendAcceptLocked()
		}
	})
	return nil
}

// Lock should be held.
func (s *stream) sendAcceptLocked() error {
	if s.acceptTimer != nil {
		s.acceptTimer.Stop()
	}
	s.acceptPending = false
	return s.sendLocked(reply.Frame{Kind: reply.Accept, Replica: s.replica, Held: time.Since(s.armed), Body: s.acceptBody})
}

// acceptBody is the body of replica's accepts, {"replica":"<id>"}: the
// same for every request, so it is made once, and shared read-only.
func acceptBody(replica string) []byte {
	b, _ := json.Marshal(struct {
		Replica string `json:"replica"`
	}{replica})
	return b
}

// last sends a head that is also the whole answer and the end: one message
// for a non-streamed answer.
func (s *stream) last(head reply.Frame, data []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopKeepaliveLocked()
	head.End, head.Body = true, data
	_ = s.sendLocked(head)
	s.ended = true
}

// end sends the end of the stream, with Llm-Error when errText is set.
func (s *stream) end(errText string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopKeepaliveLocked()
	_ = s.sendLocked(reply.Frame{Kind: reply.End, End: true, Err: errText})
	s.ended, s.broke = true, errText != ""
}

// handover ends the stream unfinished and hands it back: the gateway
// continues the answer on another replica (Llm-Handover), or, if it cannot,
// ends it with the error as for any engine failure.
func (s *stream) handover() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopKeepaliveLocked()
	_ = s.sendLocked(reply.Frame{Kind: reply.Handover, End: true, Err: errHandover.Error()})
	s.ended, s.broke = true, true
}

// fail answers with a single head that is also the end, carrying the status
// and the OpenAI error body: the shape of a rejection, after the accept.
func (s *stream) fail(e *subjects.APIError) { s.failWith(e, false) }

// failBroken is fail for an engine that broke after taking the request:
// the end carries Llm-Error too.
func (s *stream) failBroken(e *subjects.APIError) { s.failWith(e, true) }

func (s *stream) failWith(e *subjects.APIError, broken bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopKeepaliveLocked()
	f := reply.Rejection(e)
	f.Kind = reply.Head
	if broken {
		f.Err = e.Message
	}
	_ = s.sendLocked(f)
	s.ended, s.broke = true, broken
}

// unfinished reports whether the stream ended unfinished.
func (s *stream) unfinished() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.broke
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
	if s.acceptPending && s.sendAcceptLocked() != nil {
		return
	}
	ka := reply.Frame{Kind: reply.Keepalive, Seq: max(s.next-1, 0)}
	s.err = s.nc.PublishMsg(ka.Msg(s.reply))
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
