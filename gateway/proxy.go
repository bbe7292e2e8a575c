package gateway

import (
	"context"
	"errors"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/switchyard-llm/switchyard/internal/sse"
	"github.com/switchyard-llm/switchyard/subjects"
)

// upstream is one request on its way through NATS.
type upstream struct {
	tenant   string
	endpoint string
	dialect  dialect // the shape of its errors
	model    string
	stream   bool
	body     []byte
	hdr      nats.Header // request headers, shared by every attempt
	deadline time.Time
	exclude  []string
	started  time.Time
	cold     *nats.Msg // a model_loading rejection to hold for (coldwait.go)
}

// relay sends the request through brokers: attempts until one answers or
// judge says neither retry nor resume, then concludes.
func (g *Gateway) relay(w http.ResponseWriter, r *http.Request, u *upstream) {
	g.budget.active.Add(1)
	defer g.budget.active.Add(-1)
	ctx, cancel := context.WithDeadline(r.Context(), u.deadline)
	defer cancel()
	out := &response{g: g, w: w, u: u}
	res := g.tryCold(ctx, out)
	retries, cause := 0, ""
	for {
		switch judge(res) {
		case retry:
			if retries >= g.cfg.MaxRetries || !g.budget.acquire() {
				break
			}
			retries++
			g.metrics.retries.Inc()
			res = g.tryCold(ctx, out)
			g.budget.release()
			continue
		case resume:
			// A resume must find the retry budget open, but does not hold
			// it: it continues work already admitted, on the replica that
			// takes over what the failed one no longer carries, so a drain
			// can hand over every stream at once.
			if !g.budget.acquire() {
				g.metrics.resumes.WithLabelValues(res.kind.cause(), "impossible").Inc()
				break
			}
			g.budget.release()
			from := res.replica
			if cause = res.kind.cause(); !out.resume(res) {
				cause = ""
				res.resumable = false
				continue // judged again: the explicit error
			}
			g.log.Info("resuming", "from", from, "cause", res.kind.cause(), "tokens", out.carry.tokens,
				"traceparent", out.u.hdr.Get(subjects.HdrTraceparent))
			res = g.try(ctx, out)
			continue
		default:
			if res.kind.resumable() && res.accepted && cause == "" {
				g.metrics.resumes.WithLabelValues(res.kind.cause(), "impossible").Inc()
			}
		}
		break
	}
	if cause != "" {
		outcome := "completed"
		if res.kind != failNone {
			outcome = "failed"
		}
		g.metrics.resumes.WithLabelValues(cause, outcome).Inc()
	}
	g.conclude(out, res)
}

// try makes one attempt, or says why none can be made, and settles it.
func (g *Gateway) try(ctx context.Context, out *response) (res result) {
	id := nuid.Next()
	defer func() { g.settle(out.u, id, res) }()
	if ctx.Err() != nil {
		// The client left or the deadline passed: a new attempt would
		// only start an engine call nobody waits for.
		return ctxResult(ctx, "the request deadline passed before a replica answered")
	}
	if !g.nc.IsConnected() {
		// Published now, the request would wait in the reconnect buffer
		// and reach a replica after the client gave up: say so instead.
		return result{kind: failOffline, err: errOffline()}
	}
	res = g.attempt(ctx, out, id)
	res.wrote = out.wrote
	res.resumable = res.accepted && res.kind.resumable() && out.canResume()
	return res
}

// ctxResult is the result of an attempt whose context ended.
func ctxResult(ctx context.Context, deadlineMsg string) result {
	if ctx.Err() == context.DeadlineExceeded {
		return result{kind: failDeadline, err: errDeadline(deadlineMsg)}
	}
	return result{kind: failClientGone}
}

// attempt publishes the request with a fresh reply subject, waits for the
// accept within the accept timeout, then relays head, data and end in
// Llm-Seq order. It writes to the client only what the replica answered;
// every failure is returned for judge.
func (g *Gateway) attempt(ctx context.Context, out *response, id string) result {
	u := out.u
	c := g.disp.register(id)
	defer g.disp.unregister(id)

	h := make(nats.Header, len(u.hdr)+4)
	for k, v := range u.hdr {
		h[k] = v
	}
	h[subjects.HdrRequestID] = []string{id}
	if len(u.exclude) > 0 {
		h[subjects.HdrExclude] = []string{strings.Join(u.exclude, ",")}
	}
	body := u.body
	if out.cont != nil {
		body = out.cont
		out.continuationHeaders(h)
	}
	c.reply = g.replyPfx + id
	msg := &nats.Msg{Subject: g.subj.Gateway(u.tenant), Reply: c.reply, Header: h, Data: body}
	if err := g.nc.PublishMsg(msg); err != nil {
		return result{kind: failLost, err: subjects.NewError(503, subjects.CodeRouterUnavailable, "NATS unavailable: "+err.Error())}
	}
	out.reset()

	// Phase 1: the accept (or a rejection) within the accept timeout.
	timer := time.NewTimer(g.cfg.AcceptTimeout)
	defer timer.Stop()
	return g.await(ctx, out, c, timer)
}

// await waits for the accept (or a rejection) until timer fires, then
// hands the reply to a leg.
//
// A client that leaves before a broker said where it routed the request
// does not end the wait: the request is published and will reach a
// replica, so the wait goes on (within the same accept timeout) for the
// routed notice or the accept, and the result names that replica for
// settle to cancel.
func (g *Gateway) await(ctx context.Context, out *response, c *call, timer *time.Timer) result {
	var routed string
	ctxDone, gone := ctx.Done(), false
	leave := func(r result) result {
		if gone {
			return result{kind: failClientGone, replica: r.replica, accepted: r.accepted, ended: r.ended}
		}
		return r
	}
	for {
		select {
		case <-ctxDone:
			if ctx.Err() == context.Canceled && routed == "" {
				gone, ctxDone = true, nil
				continue
			}
			r := ctxResult(ctx, "the request deadline passed")
			r.replica = routed
			return r
		case <-c.overflow:
			return leave(result{kind: failOverflow, replica: routed,
				err: subjects.NewError(502, subjects.CodeUpstreamError, "the reply overflowed before the replica accepted")})
		case <-c.lost:
			return leave(result{kind: failLost, replica: routed, err: errLost()})
		case <-timer.C:
			if routed == "" {
				return leave(result{kind: failNotRouted, err: errDeadline("no broker routed the request in time")})
			}
			// The broker chose a replica that did not accept: it is left
			// out of the retry, and stopped in case it was only slow.
			return result{kind: failAcceptTimeout, replica: routed,
				err: errDeadline("replica " + routed + " did not accept the request in time")}
		case m := <-c.ch:
			if r := m.Header.Get(subjects.HdrRouted); r != "" {
				routed = r
				if gone {
					return leave(result{replica: routed})
				}
				continue
			}
			if m.Header.Get("Status") == "503" && len(m.Data) == 0 {
				// NATS no-responders: no broker is listening.
				return leave(result{kind: failNoResponders, err: subjects.NewError(503, subjects.CodeRouterUnavailable, "no broker is available")})
			}
			if a := m.Header.Get(subjects.HdrAccepted); a != "" {
				ended := m.Header.Get(subjects.HdrEOS) != ""
				if gone {
					return leave(result{replica: a, accepted: true, ended: ended})
				}
				l := leg{g: g, out: out, c: c, timer: timer, replica: a, next: 1}
				if m.Header.Get(subjects.HdrStatus) == "" {
					m = nil // the accept alone
				} // else the accept rode on the head: the engine answered within the adapter's accept delay
				return l.relay(ctx, m)
			}
			if n, err := strconv.Atoi(m.Header.Get(subjects.HdrSeq)); err == nil && n > 0 && m.Header.Get(subjects.HdrKeepalive) == "" {
				// A message from after the accept, without the accept: it
				// was lost with a NATS connection. The rest is no answer.
				return leave(result{kind: failSequenceGap, replica: routed, accepted: true, ended: m.Header.Get(subjects.HdrEOS) != "",
					err: subjects.NewError(502, subjects.CodeUpstreamError, "the reply lost its accept (sequence gap)")})
			}
			if m.Header.Get(subjects.HdrEOS) != "" {
				if gone {
					return leave(result{ended: true}) // rejected: nothing started
				}
				if out.cont == nil && g.holdable(out.u, m) {
					return result{ended: true} // held for its cold model by tryCold
				}
				return out.rejected(m)
			}
		}
	}
}

// leg is phase 2 of an accepted attempt: the replica's head, data and end.
type leg struct {
	g       *Gateway
	out     *response
	c       *call
	timer   *time.Timer // the idle timer: every message and keepalive resets it
	probe   *time.Timer // the silence probe (nil when off): reset with timer
	gone    int         // probes in a row that found nothing on the replica's subjects
	asked   bool        // a probe went out and no no-responders came for it yet
	replica string
	next    int // the Llm-Seq expected next
}

// relay relays the reply until it ends or fails; first, if not nil, is the
// head that carried the accept.
//
// An adapter sends a keepalive every subjects.KeepaliveEvery while its
// engine is silent, so a reply silent for ProbeAfter is suspect: the leg
// publishes, with its own reply subject, an empty cancel on the replica's
// cancel subject, which a live adapter takes and ignores. When nothing
// subscribes there any more (the adapter died, or lost NATS), the server
// answers the gateway "no responders" at once; a second probe, a fifth of
// ProbeAfter later, must find nothing too (a reconnecting adapter is back
// within that), and the answer fails as gone then, not at the idle
// timeout.
func (l *leg) relay(ctx context.Context, first *nats.Msg) result {
	l.timer.Reset(l.g.cfg.IdleTimeout)
	var probe <-chan time.Time
	if p := l.g.cfg.ProbeAfter; p > 0 && p < l.g.cfg.IdleTimeout {
		l.probe = time.NewTimer(p)
		defer l.probe.Stop()
		probe = l.probe.C
	}
	if first != nil {
		if r, over := l.onMsg(first); over {
			return r
		}
	}
	for {
		select {
		case <-ctx.Done():
			r := ctxResult(ctx, "the request deadline passed")
			r.replica, r.accepted = l.replica, true
			return r
		case <-l.c.lost:
			return l.fail(failLost, errLost())
		case <-l.c.overflow:
			return l.fail(failOverflow, subjects.NewError(502, subjects.CodeUpstreamError, "the client read too slowly; the stream was cut"))
		case <-l.timer.C:
			return l.fail(failSilence, errDeadline("replica "+l.replica+" went silent"))
		case <-probe:
			if l.asked {
				l.gone = 0 // the last probe found the adapter there
			}
			l.asked = true
			l.g.probe(l.replica, l.c.reply)
			l.probe.Reset(l.g.cfg.ProbeAfter)
		case m := <-l.c.ch:
			if r, over := l.onMsg(m); over {
				return r
			}
		}
	}
}

// heard restarts the silence timers: the replica is alive.
func (l *leg) heard() {
	l.timer.Reset(l.g.cfg.IdleTimeout)
	if l.probe != nil {
		l.probe.Reset(l.g.cfg.ProbeAfter)
	}
	l.gone, l.asked = 0, false
}

// probesToFail is how many probes in a row must find nothing on a silent
// replica's subjects before its answer fails as gone.
const probesToFail = 2

// onMsg handles one reply message after the accept; over reports that the
// attempt ended, and r how.
func (l *leg) onMsg(m *nats.Msg) (r result, over bool) {
	if m.Header.Get(subjects.HdrRouted) != "" {
		return r, false // the broker's notice, overtaken by the accept
	}
	if m.Header.Get(subjects.HdrKeepalive) != "" {
		// A keepalive repeats the last seq sent: slow, not dead.
		l.heard()
		return r, false
	}
	if m.Header.Get("Status") == "503" && len(m.Data) == 0 {
		// NATS no-responders to the silence probe: nothing listens on the
		// replica's subjects. One that answers no probe says nothing.
		if !l.asked {
			return r, false
		}
		l.asked = false
		if l.gone++; l.gone < probesToFail {
			l.probe.Reset(l.g.cfg.ProbeAfter / 5)
			return r, false
		}
		return l.fail(failGone, errGone(l.replica)), true
	}
	seq, err := strconv.Atoi(m.Header.Get(subjects.HdrSeq))
	if err != nil || seq != l.next {
		return l.fail(failSequenceGap, subjects.NewError(502, subjects.CodeUpstreamError, "reply from "+l.replica+" lost a message (sequence gap)")), true
	}
	l.next++
	l.heard()
	eos := m.Header.Get(subjects.HdrEOS) != ""
	if eos && m.Header.Get(subjects.HdrHandover) != "" {
		// Handed back, with or without a head before it.
		r = l.fail(failHandover, subjects.NewError(502, subjects.CodeUpstreamError, "replica "+l.replica+" drained before the answer ended"))
		r.ended = true
		return r, true
	}
	if seq == 1 {
		refused, err := l.out.head(m, l.replica)
		switch {
		case refused != nil:
			r = l.fail(failRefused, refused)
			r.ended = eos
			return r, true
		case err != nil:
			r = l.fail(failClientGone, nil) // gone as the head was flushed
			r.ended = eos
			return r, true
		}
		// A head may carry the body and the end too: a non-streamed
		// answer, or an adapter that failed before the engine answered.
	}
	if len(m.Data) > 0 {
		if err := l.out.data(m.Data); err != nil {
			switch {
			case errors.Is(err, errEngineEvent):
				r = l.fail(failEngine, subjects.NewError(502, subjects.CodeUpstreamError, "engine failed mid-response"))
			case errors.Is(err, sse.ErrEventTooLarge):
				r = l.fail(failEngine, subjects.NewError(502, subjects.CodeUpstreamError, "replica "+l.replica+": "+err.Error()))
			case errors.Is(err, os.ErrDeadlineExceeded):
				// The client stopped reading (the write deadline passed)
				// or went away: only its own stream ends.
				r = l.fail(failClientWrite, nil)
			default:
				r = l.fail(failClientGone, nil)
			}
			r.ended = eos
			return r, true
		}
	}
	if !eos {
		return r, false
	}
	if e := m.Header.Get(subjects.HdrError); e != "" {
		r = l.fail(failEngine, subjects.NewError(502, subjects.CodeUpstreamError, "engine failed mid-response: "+e))
	} else {
		l.out.finish()
		r = result{replica: l.replica, accepted: true}
	}
	r.ended = true
	return r, true
}

// fail is the result of a failure after the accept.
func (l *leg) fail(kind failure, e *subjects.APIError) result {
	return result{kind: kind, err: e, replica: l.replica, accepted: true}
}

// probe asks NATS whether anything still listens on replica's cancel
// subject: an empty cancel (no request id) with the attempt's reply
// subject, which a live adapter ignores, and to which the server answers
// no-responders when the adapter is gone (relay).
func (g *Gateway) probe(replica, reply string) {
	_ = g.nc.PublishMsg(&nats.Msg{Subject: g.subj.ReplicaCancel(replica), Reply: reply})
}

// cancelUpstream tells the adapter to stop the engine call.
func (g *Gateway) cancelUpstream(replica, id string) {
	m := nats.NewMsg(g.subj.ReplicaCancel(replica))
	m.Header.Set(subjects.HdrRequestID, id)
	_ = g.nc.PublishMsg(m)
}
