package gateway

import (
	"bytes"
	"errors"
)

// maxSSEEvent bounds one server-sent event held while it is incomplete. An
// engine's chunk is a few hundred bytes; a larger event is an upstream
// fault, not something to buffer without end.
const maxSSEEvent = 1 << 20

// errSSEEventTooLarge is the error of an event that outgrew maxSSEEvent.
var errSSEEventTooLarge = errors.New("a server-sent event is over 1 MiB")

// sseEvents cuts a byte stream into whole server-sent events: bytes are
// handed on only once the blank line ending their event has arrived, and
// an incomplete event stays held. So a stream cut mid-event (a replica that
// died) loses only that event, never forwards half of it, and what the
// client got always ends on an event boundary.
//
// Events end with "\n\n", "\r\n\r\n" or "\r\r" (the SSE grammar); each
// event handed on includes its terminator. The zero value is ready.
type sseEvents struct {
	held []byte
}

// write adds p and calls emit for each event it completes, in order. An
// error from emit stops it and is returned; an event over maxSSEEvent is
// errSSEEventTooLarge.
func (s *sseEvents) write(p []byte, emit func(event []byte) error) error {
	for len(p) > 0 {
		// An end may straddle the previous write: search from a few bytes
		// back into what is held.
		from := max(len(s.held)-3, 0)
		s.held = append(s.held, p...)
		p = nil
		for {
			end := eventEnd(s.held, from)
			if end < 0 {
				break
			}
			if err := emit(s.held[:end]); err != nil {
				s.drop(end)
				return err
			}
			s.drop(end)
			from = 0
		}
		if len(s.held) > maxSSEEvent {
			s.held = s.held[:0]
			return errSSEEventTooLarge
		}
	}
	return nil
}

// drop forgets the first n held bytes.
func (s *sseEvents) drop(n int) {
	s.held = s.held[:copy(s.held, s.held[n:])]
}

// pending is the size of the incomplete event held.
func (s *sseEvents) pending() int { return len(s.held) }

// reset drops the incomplete event: its stream ended or broke.
func (s *sseEvents) reset() { s.held = s.held[:0] }

// eventEnd returns the index just past the first event terminator found at
// or after from, or -1.
func eventEnd(b []byte, from int) int {
	for i := from; i < len(b); i++ {
		switch b[i] {
		case '\n':
			if i+1 < len(b) && b[i+1] == '\n' {
				return i + 2
			}
		case '\r':
			if i+1 < len(b) && b[i+1] == '\r' {
				return i + 2
			}
			if i+3 < len(b) && b[i+1] == '\n' && b[i+2] == '\r' && b[i+3] == '\n' {
				return i + 4
			}
		}
	}
	return -1
}

// sseData returns the data of an event: its data lines joined with "\n"
// (the SSE rule), or nil when it has none.
func sseData(event []byte) []byte {
	if v, ok := bytes.CutPrefix(event, []byte("data:")); ok {
		// The common event, one data line: no copy.
		if i := bytes.IndexAny(v, "\r\n"); i >= 0 && len(bytes.TrimLeft(v[i:], "\r\n")) == 0 {
			return bytes.TrimPrefix(v[:i], []byte(" "))
		}
	}
	var out []byte
	n := 0
	for line := range bytes.Lines(event) {
		line = bytes.TrimRight(line, "\r\n")
		v, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		v = bytes.TrimPrefix(v, []byte(" "))
		if n > 0 {
			out = append(out, '\n')
		}
		out = append(out, v...)
		n++
	}
	if n == 1 && out == nil {
		return []byte{}
	}
	return out
}
