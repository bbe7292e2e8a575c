// Package reply is the codec of the reply protocol (docs/protocol.md, "The
// reply protocol"): the messages a broker and an adapter send on a
// request's reply subject, and the gateway reads there. Each message is a
// Frame of one Kind; Decode reads a NATS message as one, and Encode writes
// one's headers, so the spelling of the protocol lives here alone. A
// Sequence holds an accepted reply to its order, for every reader of one.
package reply

import (
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/subjects"
)

// Kind is what a reply message is.
type Kind uint8

const (
	Unknown      Kind = iota // not a message of the protocol: ignored before the accept, a gap after it
	Routed                   // the broker's notice of the replica it forwards to, no Llm-Seq
	Accept                   // the adapter took the request (seq 0)
	Head                     // the engine's status and headers (seq 1), maybe with the accept, the body and the end
	Data                     // body bytes (seq 2, 3, …)
	Keepalive                // the engine is still silent: repeats the last Llm-Seq
	End                      // the answer is over (Llm-Eos), with Llm-Error when the engine failed midway
	Handover                 // the end of an answer the adapter hands back while draining
	Error                    // a rejection: status and OpenAI error body, the whole reply (seq 0)
	NoResponders             // NATS's own answer: nothing listens on the subject published to
	Present                  // an adapter's answer to a probe, naming its replica, no Llm-Seq
)

var kindNames = [...]string{"unknown", "routed", "accept", "head", "data", "keepalive", "end", "handover", "error", "no-responders", "present"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Kinds are the kinds a broker or an adapter sends: the ones
// docs/protocol.md lists.
func Kinds() []Kind {
	return []Kind{Routed, Accept, Head, Data, Keepalive, End, Handover, Error, Present}
}

// Headers are the protocol headers a frame of kind k may carry, as Encode
// writes them (Error's also carry the pass-through headers of its
// APIError, subjects.PassThroughHeaders; a head carries the engine's and
// the route headers).
func (k Kind) Headers() []string {
	switch k {
	case Routed:
		// The decider adds the budget's remainder under a budget.
		return []string{subjects.HdrRouted, subjects.HdrRouteBudget}
	case Present:
		return []string{subjects.HdrPresent}
	case Accept:
		return []string{subjects.HdrSeq, subjects.HdrAccepted, subjects.HdrHeld}
	case Head:
		return []string{subjects.HdrSeq, subjects.HdrStatus, subjects.HdrContent, subjects.HdrAccepted, subjects.HdrHeld, subjects.HdrEOS, subjects.HdrError}
	case Data:
		return []string{subjects.HdrSeq, subjects.HdrError} // Llm-Error: the marker of a lost end
	case Keepalive:
		return []string{subjects.HdrSeq, subjects.HdrKeepalive}
	case End:
		return []string{subjects.HdrSeq, subjects.HdrEOS, subjects.HdrError}
	case Handover:
		return []string{subjects.HdrSeq, subjects.HdrEOS, subjects.HdrHandover, subjects.HdrError}
	case Error:
		pt := subjects.PassThroughHeaders()
		return append([]string{subjects.HdrSeq, subjects.HdrStatus, subjects.HdrEOS, subjects.HdrContent}, pt[:]...)
	}
	return nil
}

// Frame is one message of the reply protocol.
type Frame struct {
	Kind Kind
	// Seq is Llm-Seq, -1 when absent or not a number.
	Seq int
	// Replica is the routed replica of a Routed frame, the accepting one
	// of an Accept or of a Head that carries the accept, and the probed
	// one of a Present.
	Replica string
	// Held is Llm-Held on a frame that carries the accept: how long the
	// adapter held the accept back (-1 when absent or out of range when
	// decoded).
	Held time.Duration
	// Status is Llm-Status on a Head or an Error (0 when absent).
	Status int
	// End is Llm-Eos: the reply is over (an End, a Handover, an Error, a
	// Head that is the whole answer).
	End bool
	// Err is Llm-Error: the engine failed midway (End, Handover, a Head
	// that is the end).
	Err string
	// Header is the message's own headers, for what a frame carries beyond
	// the protocol's: content type, route and pass-through headers. Encode
	// writes into it.
	Header nats.Header
	Body   []byte
}

// Decode reads m as a frame. A message is a Head by its Llm-Seq (1) or
// its Llm-Accepted with Llm-Status, so an adapter's failure after the
// accept, a head with an error status and the end, is a Head; an Error is
// a rejection before any accept.
func Decode(m *nats.Msg) Frame {
	h := m.Header
	f := Frame{Seq: -1, Header: h, Body: m.Data}
	if r := h.Get(subjects.HdrRouted); r != "" {
		f.Kind, f.Replica = Routed, r
		return f
	}
	if h.Get("Status") == "503" && len(m.Data) == 0 {
		// NATS no-responders: the server's status, not a sender's.
		f.Kind = NoResponders
		return f
	}
	seq := h.Get(subjects.HdrSeq)
	if seq == "" {
		// Outside the sequence: a present (a data frame, the common
		// case, pays no lookup for it).
		if r := h.Get(subjects.HdrPresent); r != "" {
			f.Kind, f.Replica = Present, r
			return f
		}
	}
	if n, err := strconv.Atoi(seq); err == nil && n >= 0 {
		f.Seq = n
	}
	if h.Get(subjects.HdrKeepalive) != "" {
		f.Kind = Keepalive
		return f
	}
	f.End = h.Get(subjects.HdrEOS) != ""
	f.Err = h.Get(subjects.HdrError)
	f.Replica = h.Get(subjects.HdrAccepted)
	// Llm-Status is read only where a frame may carry it: data, the
	// common case, needs no more lookups.
	switch {
	case f.Replica != "":
		if f.Kind = Accept; f.status(h) {
			f.Kind = Head // the accept rode on the head
		}
		f.Held = -1
		if us, err := strconv.ParseInt(h.Get(subjects.HdrHeld), 10, 64); err == nil && us >= 0 && us <= subjects.MaxAcceptHeld.Microseconds() {
			f.Held = time.Duration(us) * time.Microsecond
		}
	case f.Seq <= 0:
		if f.End {
			f.Kind = Error
			f.status(h)
		}
	case f.End && h.Get(subjects.HdrHandover) != "":
		f.Kind = Handover
	case f.Seq == 1:
		f.Kind = Head
		f.status(h)
	case f.End:
		f.Kind = End
	default:
		f.Kind = Data
	}
	return f
}

// status reads Llm-Status into f.Status, and reports whether it is there.
func (f *Frame) status(h nats.Header) bool {
	v := h.Get(subjects.HdrStatus)
	f.Status, _ = strconv.Atoi(v)
	return v != ""
}

// Encode writes f's protocol headers into f.Header (made when nil) and
// returns it. A header already there with a value slice is reused, so a
// sender that keeps one Header for its data frames allocates nothing for
// it per frame.
func (f *Frame) Encode() nats.Header {
	if f.Header == nil {
		f.Header = make(nats.Header, 4)
	}
	h := f.Header
	switch f.Kind {
	case Routed:
		set(h, subjects.HdrRouted, f.Replica)
		return h
	case Present:
		set(h, subjects.HdrPresent, f.Replica)
		return h
	}
	set(h, subjects.HdrSeq, strconv.Itoa(max(f.Seq, 0)))
	switch f.Kind {
	case Accept:
		set(h, subjects.HdrAccepted, f.Replica)
		set(h, subjects.HdrHeld, held(f.Held))
	case Head:
		set(h, subjects.HdrStatus, strconv.Itoa(f.Status))
		if f.Replica != "" {
			set(h, subjects.HdrAccepted, f.Replica)
			set(h, subjects.HdrHeld, held(f.Held))
		}
	case Keepalive:
		set(h, subjects.HdrKeepalive, "1")
	case Handover:
		set(h, subjects.HdrHandover, "1")
	case Error:
		set(h, subjects.HdrStatus, strconv.Itoa(f.Status))
	}
	if f.End || f.Kind == End || f.Kind == Handover || f.Kind == Error {
		set(h, subjects.HdrEOS, "1")
	}
	if f.Err != "" {
		set(h, subjects.HdrError, f.Err)
	}
	return h
}

// Msg is f as a message on subject, its headers encoded.
func (f *Frame) Msg(subject string) *nats.Msg {
	return &nats.Msg{Subject: subject, Header: f.Encode(), Data: f.Body}
}

// Rejection is the Error frame of e: its status, the OpenAI error body and
// the Retry-After and x-ratelimit-* headers e asks for. An adapter that
// fails after its accept sends the same frame as a Head.
func Rejection(e *subjects.APIError) Frame {
	f := Frame{Kind: Error, Seq: 0, Status: e.Status, End: true, Header: make(nats.Header, 6), Body: e.Body()}
	f.Header[subjects.HdrContent] = []string{"application/json"}
	for _, kv := range e.RetryAfterHeaders() {
		f.Header[kv[0]] = []string{kv[1]}
	}
	for k, v := range e.Headers {
		f.Header.Set(k, v)
	}
	return f
}

// held is Llm-Held's value for d, within its range.
func held(d time.Duration) string {
	return strconv.FormatInt(min(max(d, 0), subjects.MaxAcceptHeld).Microseconds(), 10)
}

func set(h nats.Header, k, v string) {
	h[k] = append(h[k][:0], v)
}

// Sequence holds an accepted reply to Llm-Seq order (docs/protocol.md,
// "The reply protocol"): the accept is 0, the head 1, each data frame one
// more, and the end or handover the next. A keepalive repeats the last
// number and is not counted. A frame out of order means a message was
// lost: what follows it is no answer.
//
// The zero Sequence is before the accept: no frame is in order until
// Accept is called.
type Sequence struct {
	next int // the Llm-Seq expected next; 0 until the accept
}

// Accept starts the sequence at the accept, alone (seq 0) or riding on the
// head (seq 1): the head is next.
func (s *Sequence) Accept() { s.next = 1 }

// Accepted reports whether Accept was called.
func (s *Sequence) Accepted() bool { return s.next > 0 }

// Next reports whether f, a head, data, end or handover frame, is the one
// expected next, and counts it when it is.
func (s *Sequence) Next(f *Frame) bool {
	if s.next == 0 || f.Seq != s.next {
		return false
	}
	s.next++
	return true
}
