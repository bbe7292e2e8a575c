package sse

import (
	"bytes"
	"errors"
	"fmt"
	"iter"
)

// MaxEvent is the default bound on one event, and so on what an [Events]
// holds. An engine's chunk is a few hundred bytes; a larger event is an
// upstream fault, not something to buffer without end.
const MaxEvent = 1 << 20

// ErrEventTooLarge is the error of an event that outgrew its bound.
var ErrEventTooLarge = errors.New("server-sent event too large")

// Events cuts a byte stream pushed into it into whole events, as the side
// that relays or watches a stream sees it: bytes are handed on only once
// the blank line ending their event has arrived, and an incomplete event
// stays held. So a stream cut mid-event (a replica that died) loses only
// that event, never passes half of it on, and what was handed on always
// ends on an event boundary.
//
// Lines end with LF, CR or CRLF, mixed as they come (the SSE grammar); an
// event ends with an empty line and is handed on with its terminator, so
// the bytes handed on are the bytes written. The zero value is ready and
// bounds an event at MaxEvent.
type Events struct {
	// Max bounds one event, terminator included; 0 is MaxEvent.
	Max int
	// SkipOversized drops an event that outgrows Max and carries on with
	// the next, for a reader that only watches the stream. Without it an
	// oversized event is ErrEventTooLarge: a relay cannot pass it on.
	SkipOversized bool

	held     []byte
	scan     int  // bytes of held already looked at
	text     bool // the line being scanned has a byte that is not a line end
	cr       bool // the last byte scanned was a CR: an LF next ends the same line
	ending   bool // that CR ended the event; its LF, if one follows, belongs to it
	skipping bool // dropping the rest of an oversized event
}

// Write adds p and calls emit for each event it completes, in order; the
// event is valid during the call only. An error from emit stops it and is
// returned; so is ErrEventTooLarge, for an event over Max unless
// SkipOversized. An error drops what was held: the stream is broken, and
// only a new one can follow.
func (s *Events) Write(p []byte, emit func(event []byte) error) error {
	limit := s.Max
	if limit <= 0 {
		limit = MaxEvent
	}
	// Events are cut from p itself while nothing is held: a chunk that is
	// whole events (the common one) is not copied.
	b := p
	if len(s.held) > 0 {
		s.held = append(s.held, p...)
		b = s.held
	}
	for {
		end := s.next(b)
		if end < 0 {
			break
		}
		var err error
		switch {
		case s.skipping:
			s.skipping = false // the oversized event's end: dropped
		case end > limit:
			if !s.SkipOversized {
				err = tooLarge(limit)
			}
		default:
			err = emit(b[:end])
		}
		if err != nil {
			s.Reset()
			return err
		}
		b = b[end:]
	}
	if len(b) > limit {
		if !s.SkipOversized {
			s.Reset()
			return tooLarge(limit)
		}
		// Keep the scanning state, drop the bytes: the event's end is
		// still to come.
		s.held, s.scan, s.skipping = s.held[:0], 0, true
		return nil
	}
	s.held = append(s.held[:0], b...) // b may overlap held: append moves it
	return nil
}

func tooLarge(limit int) error {
	return fmt.Errorf("%w: over %d bytes", ErrEventTooLarge, limit)
}

// next scans b on from where the last scan stopped and returns the length
// of the first whole event, or -1 when b ends inside one.
func (s *Events) next(b []byte) int {
	for i := s.scan; i < len(b); i++ {
		c := b[i]
		if s.cr {
			s.cr = false
			if c == '\n' {
				if s.ending {
					s.ending, s.scan = false, 0
					return i + 1
				}
				continue
			}
			if s.ending {
				s.ending, s.scan = false, 0
				return i
			}
		}
		switch c {
		case '\r':
			s.cr = true
			if !s.text {
				s.ending = true // an empty line; an LF may follow
			}
			s.text = false
		case '\n':
			if !s.text {
				s.scan = 0
				return i + 1
			}
			s.text = false
		default:
			s.text = true
			// On to the line's end: two vector scans beat a byte loop.
			rest := b[i+1:]
			j := bytes.IndexByte(rest, '\n')
			if j < 0 {
				j = len(rest)
			}
			if k := bytes.IndexByte(rest[:j], '\r'); k >= 0 {
				j = k
			}
			i += j
		}
	}
	s.scan = len(b)
	return -1
}

// Pending is the incomplete event held: what the stream ended with when
// it ended without a blank line. It is valid until the next Write or Reset.
func (s *Events) Pending() []byte {
	if s.skipping {
		return nil
	}
	return s.held
}

// End is the end of the stream: what is held is whole all the same (an
// engine that ended without a blank line after its last event, or with a
// CR that an LF did not follow), and emit gets it as the last event, its
// end completed to a blank line. Then the state is reset.
func (s *Events) End(emit func(event []byte) error) error {
	defer s.Reset()
	ev := s.Pending()
	if len(ev) == 0 {
		return nil
	}
	switch {
	case s.ending: // an empty line ended it; only an LF could have followed
	case ev[len(ev)-1] == '\r':
		ev = append(ev, '\r') // a line ended by CR: a CR is the empty line
	case ev[len(ev)-1] == '\n':
		ev = append(ev, '\n')
	default:
		ev = append(ev, "\n\n"...)
	}
	s.held = ev
	return emit(ev)
}

// Reset drops the incomplete event: its stream ended or broke.
func (s *Events) Reset() {
	s.held = s.held[:0]
	s.scan, s.text, s.cr, s.ending, s.skipping = 0, false, false, false, false
}

// Lines yields the field lines of an event (or of any run of lines),
// skipping empty lines and comments, as a [Reader] reads them.
func Lines(event []byte) iter.Seq[Line] {
	return func(yield func(Line) bool) {
		for len(event) > 0 {
			var raw []byte
			raw, event = cutLine(event)
			if len(raw) > 0 && raw[0] != ':' && !yield(parse(raw, false)) {
				return
			}
		}
	}
}

// Data returns the data of an event: its data fields joined with "\n" (the
// SSE rule), or nil when it has none.
func Data(event []byte) []byte {
	// The common event, one data line and its terminator: no copy.
	if raw, rest := cutLine(event); len(raw) > 0 {
		if l := parse(raw, false); l.Field == "data" && onlyLineEnds(rest) {
			if l.Value == nil {
				return []byte{}
			}
			return l.Value
		}
	}
	var out []byte
	n := 0
	for l := range Lines(event) {
		if l.Field != "data" {
			continue
		}
		if n > 0 {
			out = append(out, '\n')
		}
		out = append(out, l.Value...)
		n++
	}
	if n > 0 && out == nil {
		return []byte{}
	}
	return out
}

// cutLine returns b's first line, its end (LF, CR or CRLF) dropped, and
// what follows it.
func cutLine(b []byte) (line, rest []byte) {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		i = len(b)
	}
	if j := bytes.IndexByte(b[:i], '\r'); j >= 0 {
		if j+1 < len(b) && b[j+1] == '\n' {
			return b[:j], b[j+2:]
		}
		return b[:j], b[j+1:]
	}
	if i == len(b) {
		return b, nil
	}
	return b[:i], b[i+1:]
}

func onlyLineEnds(b []byte) bool {
	for _, c := range b {
		if c != '\n' && c != '\r' {
			return false
		}
	}
	return true
}
