package stages

import (
	"slices"

	"github.com/nats-io/nats.go"
)

// MsgShape is the size of one NATS message: the length of each header
// line's key and value, in order, and the body's length. The bus floor
// (cmd/benche2e's nats-floor role) sends messages of these shapes.
type MsgShape struct {
	Header [][2]int `json:"header"`
	Body   int      `json:"body"`
}

// Legs are the shapes of one request's two legs on the bus: the request
// the gateway published and the reply messages it took, in order.
type Legs struct {
	Request MsgShape   `json:"request"`
	Replies []MsgShape `json:"replies"`
}

// maxReplies bounds the reply shapes kept for one request.
const maxReplies = 4096

// ShapeOf is m's shape, its header lines in the order of their keys.
func ShapeOf(m *nats.Msg) MsgShape {
	s := MsgShape{Body: len(m.Data)}
	keys := make([]string, 0, len(m.Header))
	for k := range m.Header {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		for _, v := range m.Header[k] {
			s.Header = append(s.Header, [2]int{len(k), len(v)})
		}
	}
	return s
}

// RequestLeg records m, the request leg of sampled request id, as the
// legs' request and forgets the replies of any earlier one: the legs are
// the last sampled request's (meant for requests sent one at a time). The
// shape is worked out outside the recorder's lock.
func (r *Recorder) RequestLeg(id string, m *nats.Msg) {
	if r == nil || m.Reply == "" || !r.Sampled(id) {
		return
	}
	shape, reply := ShapeOf(m), m.Reply
	r.mu.Lock()
	defer r.mu.Unlock()
	r.legsReply.Store(&reply)
	r.legs = Legs{Request: shape}
}

// ReplyLeg records m when it came on the reply subject of the last
// request leg recorded. Any other message costs an atomic load and a
// comparison: no lock.
func (r *Recorder) ReplyLeg(m *nats.Msg) {
	if r == nil {
		return
	}
	p := r.legsReply.Load()
	if p == nil || *p != m.Subject {
		return
	}
	shape := ShapeOf(m)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.legsReply.Load() == p && len(r.legs.Replies) < maxReplies {
		r.legs.Replies = append(r.legs.Replies, shape)
	}
}

// Legs returns the legs last recorded (a copy).
func (r *Recorder) Legs() Legs {
	if r == nil {
		return Legs{}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return Legs{Request: r.legs.Request, Replies: slices.Clone(r.legs.Replies)}
}
