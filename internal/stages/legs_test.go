package stages

import (
	"testing"

	"github.com/nats-io/nats.go"
)

// The legs are the last sampled request's: its request and the replies on
// its reply subject only; a request not sampled, and replies of any other
// subject, leave them alone.
func TestLegsAreTheLastSampledRequests(t *testing.T) {
	r := New(1)
	r.Begin("a", r.Now())
	req := &nats.Msg{Subject: "llm.replica.x", Reply: "llm.reply.g.a", Header: nats.Header{"Llm-Model": {"m"}}, Data: make([]byte, 100)}
	r.RequestLeg("a", req)
	r.ReplyLeg(&nats.Msg{Subject: "llm.reply.g.a", Header: nats.Header{"Llm-Seq": {"1"}}, Data: make([]byte, 7)})
	r.ReplyLeg(&nats.Msg{Subject: "llm.reply.g.other", Data: make([]byte, 9)})
	r.RequestLeg("not-sampled", &nats.Msg{Reply: "llm.reply.g.n", Data: make([]byte, 5)})
	l := r.Legs()
	if l.Request.Body != 100 || len(l.Request.Header) != 1 || l.Request.Header[0] != [2]int{9, 1} {
		t.Errorf("request %+v", l.Request)
	}
	if len(l.Replies) != 1 || l.Replies[0].Body != 7 || l.Replies[0].Header[0] != [2]int{7, 1} {
		t.Errorf("replies %+v", l.Replies)
	}
	l.Replies[0].Body = 0 // a copy
	if r.Legs().Replies[0].Body != 7 {
		t.Error("Legs returned the recorder's own slice")
	}
	r.Begin("b", r.Now())
	r.RequestLeg("b", &nats.Msg{Reply: "llm.reply.g.b", Data: make([]byte, 3)})
	r.ReplyLeg(&nats.Msg{Subject: "llm.reply.g.a", Data: make([]byte, 7)}) // a's, late
	if l := r.Legs(); l.Request.Body != 3 || len(l.Replies) != 0 {
		t.Errorf("after b: %+v", l)
	}
	var off *Recorder
	off.RequestLeg("a", req)
	off.ReplyLeg(req)
	if l := off.Legs(); l.Request.Body != 0 {
		t.Error("a nil recorder recorded")
	}
}
