package gateway

import (
	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/decider"
	"github.com/switchyard-llm/switchyard/internal/stages"
	"github.com/switchyard-llm/switchyard/subjects"
)

// sent is what publish did with one attempt.
type sent struct {
	msg       *nats.Msg // the message published (the one copies repeat); nil when refused
	toBrokers bool      // msg went to the brokers, which answer with a routed notice
	// replica and budget are the route this gateway decided: the replica
	// msg went to, and what the request's budget has left after it.
	replica, budget string
	// refusal is this gateway's decision not to send the request.
	refusal *subjects.APIError
}

// publish sends one attempt on its way: decided here and published once,
// straight to the chosen replica, when the gateway decides; else encoded
// into headers and published to the brokers on llm.gw.<tenant>.
//
// A request naming a stored response goes to the brokers either way:
// they read the owners bucket, which a gateway's identity may not.
//
// The stage record's Published mark (request id) is taken as the message
// is handed to NATS, before the write: a broker or replica can act on it
// before this goroutine runs again.
func (g *Gateway) publish(id string, u *upstream, in *decider.Request) (sent, error) {
	h := in.Header
	if g.dec == nil || h[subjects.HdrPreviousResponse] != nil {
		if h[subjects.HdrMethod] == nil { // a stored response's GET or DELETE has no features
			in.Encode(h)
		}
		m := &nats.Msg{Subject: g.subj.Gateway(u.tenant), Reply: in.Reply, Header: h, Data: in.Body}
		g.cfg.Stages.Mark(id, stages.Published)
		g.cfg.Stages.RequestLeg(id, m)
		return sent{msg: m, toBrokers: true}, g.nc.PublishMsg(m)
	}
	s := g.dec.Get()
	defer g.dec.Release(s)
	route, refusal := g.dec.Decide(s, in)
	if refusal != nil {
		return sent{refusal: refusal}, nil
	}
	g.cfg.Stages.Mark(id, stages.Published)
	m := route.Msg
	g.cfg.Stages.RequestLeg(id, &m)
	return sent{msg: &m, replica: route.Replica, budget: route.Budget}, g.nc.PublishMsg(&m)
}
