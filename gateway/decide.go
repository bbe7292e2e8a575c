package gateway

import (
	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/decider"
	"github.com/switchyard-llm/switchyard/internal/stages"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/subjects/reply"
)

// publish sends one attempt on its way: decided here and published once,
// straight to the chosen replica, when the gateway decides; else to the
// brokers on llm.gw.<tenant>.
//
// What the decision says reaches the attempt's mailbox as a broker's
// answer would: the routed notice before the request goes out, or the
// rejection instead of it. The leg reads both as it reads a broker's, so
// retries, exclusions, cold holds and the reply protocol behave the same
// whichever part decided.
//
// A request naming a stored response goes to the brokers either way:
// they read the owners bucket, which a gateway's identity may not.
//
// It returns the message published (the one copies repeat) and whether it
// went to the brokers.
//
// The stage record's Published mark (request id) is taken as the message
// is handed to NATS, before the write: a broker or replica can act on it
// before this goroutine runs again.
func (g *Gateway) publish(c *call, id, replyTo string, u *upstream, h nats.Header, body []byte) (msg *nats.Msg, toBrokers bool, err error) {
	toBroker := func() (*nats.Msg, bool, error) {
		m := &nats.Msg{Subject: g.subj.Gateway(u.tenant), Reply: replyTo, Header: h, Data: body}
		g.cfg.Stages.Mark(id, stages.Published)
		return m, true, g.nc.PublishMsg(m)
	}
	if g.dec == nil {
		return toBroker()
	}
	s := g.dec.Get()
	defer g.dec.Release(s)
	a := g.dec.Handle(s, g.subj.Gateway(u.tenant), replyTo, h, body)
	switch a.Do {
	case decider.DoForward:
		notice := reply.Frame{Kind: reply.Routed, Replica: a.Replica(), Header: make(nats.Header, 1)}
		if v := a.Msg.Header.Get(subjects.HdrRouteBudget); v != "" {
			notice.Header[subjects.HdrRouteBudget] = []string{v}
		}
		c.deliver(notice.Msg(g.subj.RoutedFor(replyTo))) // where a broker would send it
		m := a.Msg
		g.cfg.Stages.Mark(id, stages.Published)
		return &m, false, g.nc.PublishMsg(&m)
	case decider.DoRefuse:
		g.cfg.Stages.Mark(id, stages.Published)
		m := new(nats.Msg)
		g.dec.Reject(m, replyTo, a.Err)
		c.deliver(m)
		return m, false, nil
	}
	return toBroker()
}
