package adapter

import (
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/subjects/reply"
)

// tailWindow is how long before a lost connection a reply's end may have
// been lost with it: what the client wrote to the socket of a NATS server
// that died, before it noticed. A killed server's socket closes at once; a
// server that goes silent is noticed at the ping timeout (natsconn: three
// pings 5 s apart), within this.
const tailWindow = 30 * time.Second

// maxTails bounds the ends remembered; the oldest go first.
const maxTails = 8192

// tails remembers where recent replies ended. Messages published in the
// moments before the adapter noticed its NATS connection was gone may be
// lost; a stream still running shows its loss at the gateway as a gap in
// Llm-Seq with its next message, but a reply whose end was lost would
// otherwise leave the gateway waiting for the idle timeout. So after a
// reconnect the adapter sends, to every reply that ended within tailWindow
// of the loss, a marker numbered one past its end: a gateway still waiting
// sees the gap and fails the request at once (or retries it, if nothing was
// accepted); a gateway that had the whole reply has forgotten the subject
// and drops the marker.
type tails struct {
	mu     sync.Mutex
	ended  []tail // oldest first
	lostAt time.Time
}

type tail struct {
	reply string
	next  int // Llm-Seq one past the last message sent
	at    time.Time
}

// add remembers where st ended, if it sent anything.
func (t *tails) add(st *stream, now time.Time) {
	st.mu.Lock()
	reply, next := st.reply, st.next
	st.mu.Unlock()
	if next == 0 {
		return // nothing was sent
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ended = append(t.ended, tail{reply: reply, next: next, at: now})
	// While the connection is lost nothing ages out: the ends from before
	// the loss are marked at the reconnect. maxTails bounds them either way.
	drop := 0
	for ; drop < len(t.ended); drop++ {
		over := len(t.ended)-drop > maxTails
		old := t.lostAt.IsZero() && now.Sub(t.ended[drop].at) > tailWindow
		if !over && !old {
			break
		}
	}
	t.ended = t.ended[drop:]
}

// lost records when the connection was found gone (the first time since
// the last reconnect).
func (t *tails) lost(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.lostAt.IsZero() {
		t.lostAt = now
	}
}

// reconnected returns the ends that may have been lost and forgets them.
func (t *tails) reconnected() []tail {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.lostAt.IsZero() {
		return nil
	}
	var out []tail
	for _, e := range t.ended {
		if !e.at.Before(t.lostAt.Add(-tailWindow)) {
			out = append(out, e)
		}
	}
	t.ended, t.lostAt = nil, time.Time{}
	return out
}

// watchConnection re-announces the replica (its heartbeat, and its
// cached keys as a resend) and marks the ends that may have been lost,
// after each reconnect, until ctx ends.
func (a *Adapter) watchConnection(done <-chan struct{}) {
	status := a.nc.StatusChanged(nats.DISCONNECTED, nats.RECONNECTING, nats.CONNECTED)
	defer a.nc.RemoveStatusListener(status)
	for {
		select {
		case <-done:
			return
		case st := <-status:
			if st != nats.CONNECTED {
				a.tails.lost(time.Now())
				continue
			}
			// Re-announce: deciders that lost the replica's heartbeats
			// (or its server) learn its state now and its cached keys
			// within the resend interval (a second), not at the next
			// heartbeat or ask.
			a.publishHeartbeat()
			if a.kv != nil {
				a.kv.resendSoon(time.Now())
			}
			marked := a.tails.reconnected()
			for _, e := range marked {
				// One past the end, without Llm-Eos: a gap to a gateway
				// still waiting for the end.
				mark := reply.Frame{Kind: reply.Data, Seq: e.next, Err: "replica " + a.cfg.Replica + " lost its NATS connection; the end of this reply may be lost"}
				_ = a.nc.PublishMsg(mark.Msg(e.reply))
			}
			if len(marked) > 0 {
				a.log.Warn("NATS reconnected; marked the ends of replies that may have been lost", "replies", len(marked))
			}
		}
	}
}
