package gateway

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/decider"
	"github.com/switchyard-llm/switchyard/internal/clip"
	"github.com/switchyard-llm/switchyard/internal/sse"
	"github.com/switchyard-llm/switchyard/internal/stages"
	"github.com/switchyard-llm/switchyard/internal/telemetry"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/subjects/reply"
)

// upstream is one request on its way through NATS.
type upstream struct {
	tenant   string
	endpoint string
	dialect  dialect // the shape of its errors
	model    string
	stream   bool
	body     []byte
	hdr      nats.Header    // request headers, shared by every attempt
	route    policy.Request // the routing features, shared by every attempt
	key      string         // the hash of the API key, whose budget the decider charges
	deadline time.Time
	exclude  []string // replicas that failed this request: not tried again
	avoid    []string // replicas slow to accept it: tried again only when no other is left
	started  time.Time
	bodyAt   int64 // the body's arrival on the stage recorder's clock (0: not recording)
	// tries counts the attempts made (try); admitted says the request
	// holds a place under the concurrency limit, accepted that a
	// replica accepted one of its attempts (an admitted request's place
	// is then no longer pending: overload.go; and a link lost after it
	// no longer sends it to another gateway: conclude).
	tries              int
	admitted, accepted bool
	// linkBack is when an attempt of it found the NATS link back after
	// waiting for it (zero: it never waited).
	linkBack time.Time
	// gone are its replicas that left the bus under it.
	gone goneReplicas
	// busy is the last refusal of a replica that had no room for it.
	busy error
}

// relay sends the request through brokers. Each attempt's result goes to
// judge, and the verdict says what comes next: a hold, a wait, a retry or
// a resume makes another attempt; any other verdict ends the request, as
// conclude writes it.
func (g *Gateway) relay(w http.ResponseWriter, r *http.Request, u *upstream) {
	g.budget.active.Add(1)
	defer g.budget.active.Add(-1)
	ctx, cancel := context.WithDeadline(r.Context(), u.deadline)
	defer cancel()
	out := &response{g: g, w: w, u: u}
	b := budgets{retries: g.cfg.MaxRetries, resumes: maxResumes, shared: &g.budget}
	resumed := "" // the cause of the failure a continuation resumed from
	res := g.try(ctx, out)
	for {
		switch v := judge(res, &b); v {
		case hold:
			// Held while its cold model loads, then tried again; a hold
			// that ends otherwise has a result of its own.
			if held, ready := g.hold(ctx, out, res); ready {
				res = g.try(ctx, out)
			} else {
				res = held
			}
		case wait:
			if res.kind == failReplicasBack && res.replica == "" {
				// None left once the gone ones were left out; another
				// gone one (named) is only left out, and the next
				// attempt, a poll later, may find a live one.
				g.awaitGone(ctx, out.u)
			} else {
				pause(ctx, offlinePoll)
			}
			res = g.try(ctx, out)
		case retry:
			g.metrics.retries.Inc()
			traced := g.traceAttempt(ctx, u, telemetry.EventRetry, res, 0)
			res = g.try(ctx, out)
			traced()
			b.release()
		case resume:
			resumed = res.kind.cause()
			out.resume(res)
			g.resumedFrom(res.replica, res.id)
			g.log.InfoContext(telemetry.LogContext(ctx, u.hdr), "resuming", "from", res.replica, "cause", resumed, "tokens", out.carry.tokens,
				"traceparent", u.hdr.Get(subjects.HdrTraceparent))
			traced := g.traceAttempt(ctx, u, telemetry.EventResume, res, out.carry.tokens)
			res = g.try(ctx, out)
			traced()
		default:
			g.countResume(resumed, res)
			g.conclude(out, res, v)
			return
		}
	}
}

// countResume counts, for switchyard_gateway_resumes_total, how a
// request's continuation ended (resumed: its cause), or that an answer that
// failed mid-way could not continue.
func (g *Gateway) countResume(resumed string, res result) {
	switch {
	case resumed != "" && res.kind == failNone:
		g.metrics.resumes.WithLabelValues(resumed, "completed").Inc()
	case resumed != "":
		g.metrics.resumes.WithLabelValues(resumed, "failed").Inc()
	case res.kind.resumable() && res.accepted:
		g.metrics.resumes.WithLabelValues(res.kind.cause(), "impossible").Inc()
	}
}

// try makes one attempt, or says why none can be made, and settles it.
// An answer that failed mid-way comes back with its continuation, when it
// can have one, for judge to weigh.
func (g *Gateway) try(ctx context.Context, out *response) (res result) {
	id := nuid.Next()
	defer func() {
		res.wrote = out.wrote
		if res.id != "" {
			// Another copy than the first may have been the
			// attempt's (attempt ended the others' stage records).
			id = res.id
		}
		g.settle(out.u, id, res)
	}()
	if ctx.Err() != nil {
		// The client left or the deadline passed: a new attempt would
		// only start an engine call nobody waits for.
		return ctxResult(ctx, " before a replica answered")
	}
	under := out.u.tries > 0 // an attempt of it went out before
	out.u.tries++
	if up, waited := g.linkUp(ctx, under); waited && up {
		out.u.linkBack = time.Now()
	} else if !up {
		if ctx.Err() != nil {
			return ctxResult(ctx, " while the gateway's NATS link was down")
		}
		if g.silent.Load() {
			return result{kind: failOffline, err: errLinkSilent.about(PongsToMiss, g.cfg.LinkCheck)}
		}
		return result{kind: failOffline, err: errOffline}
	}
	res = g.attempt(ctx, out, id)
	if res.accepted && res.kind.resumable() {
		res.cont = out.continuation(res)
	}
	return res
}

// linkUp reports whether the gateway's NATS link carries: connected and
// not silent. For a request already under way (wait: an attempt of it went
// out and failed with the link, before any replica accepted it) a link
// that does not waits up to OfflineWait (within the request's context) for
// it to come back: a cut server is given up within about two seconds and
// the connection moves to another member, so a request whose body is held
// and of which nothing reached the client goes through the new path
// instead of failing. A new request is answered at once: the gateway is
// unready (/readyz), and a load balancer or client does better sending it
// to another gateway. (A silent connection is asked first: it can hold its
// lock while a write waits.) Published into a link that is down, the
// request would wait in the reconnect buffer and reach a replica after the
// client gave up.
//
// It reports whether the link carries, and whether it waited for it.
func (g *Gateway) linkUp(ctx context.Context, wait bool) (ok, waited bool) {
	up := func() bool { return !g.silent.Load() && g.nc.IsConnected() }
	if up() {
		return true, false
	}
	if !wait || g.cfg.OfflineWait <= 0 {
		return false, false
	}
	g.metrics.offlineWaits.Inc()
	limit := time.NewTimer(g.cfg.OfflineWait)
	defer limit.Stop()
	poll := time.NewTicker(offlinePoll)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return false, true
		case <-limit.C:
			return up(), true
		case <-poll.C:
			if up() {
				return true, true
			}
		}
	}
}

// pause waits d, or less when ctx ends first.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// HdrRetryElsewhere marks a 503 the gateway answered because its NATS
// link is down, for a request no replica's accept reached it for: sent
// nowhere, or lost with the link before an accept came back (a replica whose
// accept was lost may still run it, as one does when judge retries it
// through the gateway's own link). A load balancer may send the same
// request to another gateway (Envoy: retry_on retriable-headers).
const HdrRetryElsewhere = "X-Switchyard-Retry-Elsewhere"

// offlinePoll is how often a request waiting for the link, or for the
// brokers after it, looks again.
const offlinePoll = 20 * time.Millisecond

// ctxResult is the result of an attempt whose context ended; detail
// completes the message of a deadline.
func ctxResult(ctx context.Context, detail string) result {
	if ctx.Err() == context.DeadlineExceeded {
		return result{kind: failDeadline, err: errDeadline.about(detail)}
	}
	return result{kind: failClientGone}
}

// attempt decides and sends the request with a fresh reply subject (the
// decide and send phases: publish), then its leg relays the reply. It
// writes to the client only what the replica answered; every failure is
// returned for judge. A copy that no broker speaks for within the routed
// timeout is sent again (leg.sendCopy); the result is the copy's a broker
// spoke for first, and names its request id.
func (g *Gateway) attempt(ctx context.Context, out *response, id string) result {
	u := out.u
	c := g.disp.register(id)
	defer g.disp.unregister(c)

	h := attemptHeader(u.hdr)
	h[subjects.HdrRequestID] = []string{id}
	in := decider.Request{Policy: u.route, Key: u.key, Header: h, Reply: g.replyPfx + id, Body: u.body}
	in.Policy.Exclude, in.Policy.Avoid = u.exclude, u.avoid
	if out.cont != nil {
		in.Body = out.cont
		out.continueRequest(&in.Policy)
	}
	g.cfg.Stages.Begin(id, u.bodyAt)
	sent, err := g.publish(id, u, &in)
	if err != nil {
		return result{kind: failLost, err: errPublish.about(err)}
	}
	out.reset()
	out.attempt = id

	// The accept (or a rejection) within the accept timeout, then the
	// replica's head, data and end within the idle timeout.
	l := g.newLeg(out, c, sent.msg, !sent.toBrokers, id)
	defer l.stop()
	var r result
	switch {
	case sent.refusal != nil:
		r = l.rejection(reply.Rejection(sent.refusal))
	default:
		if sent.replica != "" {
			// Decided here: the route is known before anything comes back.
			l.routedTo(sent.replica, sent.budget)
			l.send.spoken = true
		}
		r = l.run(ctx)
	}
	r.id = l.send.copies[l.send.chosen].id
	for i, c := range l.send.copies {
		if i != l.send.chosen {
			// The copies that lost end their stage records unrecorded:
			// the chosen copy's marks are the request's.
			g.cfg.Stages.End(c.id)
		}
	}
	return r
}

// attemptHeader is a copy of the request's headers for one attempt, with
// values of its own (cut from one array): a gateway that decides writes the
// route headers and the decision span's traceparent into them in place
// (decider's setHeader, telemetry.Inject), and the request's own must stay
// as the client sent them for the next attempt, whose trace links to the
// gateway's span, not to the last decision.
func attemptHeader(hdr nats.Header) nats.Header {
	n := 0
	for _, v := range hdr {
		n += len(v)
	}
	h := make(nats.Header, len(hdr)+24) // room for the features and route headers
	vals := make([]string, 0, n)
	for k, v := range hdr {
		i := len(vals)
		vals = append(vals, v...)
		h[k] = vals[i:len(vals):len(vals)]
	}
	return h
}

// sentCopy is one copy of an attempt sent to the broker queue group.
type sentCopy struct {
	id string    // its request id, the last token of its reply subject
	at time.Time // when it was published
}

// phase is where an attempt stands. It is decided and sent (attempt:
// publish) before its leg begins; the leg then waits in phaseSent for the
// routed notice and the accept (or a rejection), in phaseAccepted for the
// head, and relays data in phaseStreaming until the end. Whatever ends it,
// the result is settled (try) and judged (relay).
type phase uint8

const (
	phaseSent phase = iota
	phaseAccepted
	phaseStreaming
)

// leg is one attempt's side of the reply protocol: it waits for the accept
// (or a rejection), then relays the accepting replica's head, data and end
// in Llm-Seq order.
//
// A client that leaves before a broker said where it routed the request
// does not end the wait: the request is published and will reach a
// replica, so the wait goes on (within the same accept timeout) for the
// routed notice or the accept, and the result names that replica for
// settle to cancel.
//
// A broker sends its routed notice within milliseconds of taking a copy;
// none within the routed timeout (and no rejection) means the copy went to
// a broker that is cut off or stalled, which the server keeps in the queue
// group until its pings give the connection up. The leg then publishes
// another copy with a request id (and reply subject) of its own, up to
// MaxCopies within the accept timeout, holding a unit of the copies'
// budget (acquireCopy) while it does. The first copy a broker speaks for is the attempt's, its
// accept timeout counted from its own publication; a copy routed after
// that (a stalled broker catching up, a healed link delivering what it
// held) is cancelled on the replica it was routed to, here or, once the
// attempt is over, by the dispatcher (lateRoute). Every frame stays on its
// copy's subject, so two replicas never answer on one.
//
// Once accepted, an adapter sends a keepalive every
// subjects.KeepaliveEvery while its engine is silent, so a reply silent
// for ProbeAfter is suspect: the leg publishes, with its own reply
// subject, an empty cancel on the replica's cancel subject, which a live
// adapter answers present (no progress of the answer: it resets no
// timer). When nothing subscribes there any more (the
// adapter died, or lost NATS), the server answers the gateway "no
// responders" at once; a second probe, a fifth of ProbeAfter later, must
// find nothing too (a reconnecting adapter is back within that), and the
// answer fails as gone then, not at the idle timeout.
type leg struct {
	g     *Gateway
	out   *response
	c     *call
	phase phase
	timer *time.Timer // the accept timer, then the idle timer: every message and keepalive resets it

	// phaseSent: the copies sent, the replica a broker's notice named,
	// whether the client left before the request was routed, and the
	// accept timeouts waited out because the routed replica looked alive.
	send   sending
	routed string
	left   bool
	waits  int

	// phaseAccepted and phaseStreaming: the replica that accepted, the
	// reply's Llm-Seq order, and the probe of its silence.
	replica string
	seq     reply.Sequence
	watch   silence
}

// sending is the copies of an attempt's request sent so far.
type sending struct {
	msg    *nats.Msg   // the first, which the others repeat under their own ids
	direct bool        // msg went to its replica (this gateway decided), not to the brokers
	copies []sentCopy  // the copies sent, the first first
	chosen int         // the copy a broker spoke for (the first until one did)
	spoken bool        // a broker spoke for copies[chosen]
	resend *time.Timer // the next copy's (nil when none will be sent)
	budget bool        // a unit of the copies' budget is held
	waits  int         // accept timeouts waited out with no broker's word (copyLonger)
}

// silence is the probe of an accepted replica's silence, and of a routed
// replica's before its accept where the gateway does not decide.
type silence struct {
	probe  *time.Timer // nil when off
	missed int         // probes in a row that found nothing on the replica's subjects
	asked  bool        // a probe went out and no no-responders came for it yet
	absent bool        // a probe of the routed replica went out and no present came back yet
}

// newLeg starts the leg of an attempt sent as msg (direct: to its
// replica) under request id: the accept is due within the accept timeout.
func (g *Gateway) newLeg(out *response, c *call, msg *nats.Msg, direct bool, id string) *leg {
	l := &leg{g: g, out: out, c: c, timer: time.NewTimer(g.cfg.AcceptTimeout),
		send: sending{msg: msg, direct: direct, copies: []sentCopy{{id: id, at: time.Now()}}}}
	if rt := g.cfg.RoutedTimeout; rt > 0 && rt < g.cfg.AcceptTimeout && !direct {
		// Copies stand in for a request a broker lost; one the gateway
		// decided itself went to its replica, whose accept timeout rules.
		l.send.resend = time.NewTimer(rt)
	}
	return l
}

// run waits for the attempt's reply until it ends or fails.
func (l *leg) run(ctx context.Context) result {
	ctxDone := ctx.Done()
	for {
		var probe, resend <-chan time.Time
		if l.watch.probe != nil {
			probe = l.watch.probe.C
		}
		if l.send.resend != nil {
			resend = l.send.resend.C
		}
		select {
		case <-ctxDone:
			if l.phase == phaseSent && ctx.Err() == context.Canceled && l.routed == "" {
				l.left, ctxDone = true, nil
				l.stopResending() // nobody waits for another copy
				continue
			}
			return l.failed(ctxResult(ctx, ""))
		case <-l.c.overflow:
			if l.phase == phaseSent {
				return l.failed(result{kind: failOverflow, err: errEarlyFlood})
			}
			return l.failed(result{kind: failOverflow, err: errSlowClient})
		case <-l.c.lost:
			return l.failed(result{kind: failLost, err: errLost})
		case <-l.timer.C:
			if r, over := l.timedOut(); over {
				return r
			}
		case <-probe:
			l.askReplica()
		case <-resend:
			l.sendCopy()
		case m := <-l.c.ch:
			f, ok := l.g.decode(m)
			if !ok || !l.mine(m.Subject, f) {
				continue
			}
			if r, over := l.on(f); over {
				return r
			}
		}
	}
}

// failed is r, a failure of the attempt, with what its phase knows: the
// replica it was routed to before the accept (unless the client left
// meanwhile: leave), the replica that accepted after it.
func (l *leg) failed(r result) result {
	if l.phase == phaseSent {
		r.replica = l.routed
		return l.leave(r)
	}
	r.replica, r.accepted = l.replica, true
	return r
}

// timedOut is the accept or the idle timer's end: the attempt fails,
// unless the routed replica looks alive and the attempt waits longer.
func (l *leg) timedOut() (r result, over bool) {
	switch {
	case l.phase != phaseSent:
		return l.failed(result{kind: failSilence, err: errSilence.about(l.replica)}), true
	case l.routed == "" && l.copyLonger():
		return r, false
	case l.routed == "":
		return l.failed(result{kind: failNotRouted, err: errNotRouted}), true
	case l.waitLonger():
		return r, false
	}
	// The broker chose a replica that did not accept: it is stopped, and
	// the retry goes elsewhere if anywhere else is left (settle).
	return l.failed(result{kind: failAcceptTimeout, err: errNotAccepted.about(l.routed)}), true
}

// AcceptWaits bounds how many accept timeouts an attempt of a gateway
// that decides waits for the accept of a replica that looks alive, before
// the retry; AcceptWaitsUnseen bounds those of a gateway that does not,
// which has no heartbeats to tell a frozen replica from a slow one, and,
// counted apart, those an attempt waits for any broker's word
// (copyLonger).
const (
	AcceptWaits       = 8
	AcceptWaitsUnseen = 4
)

// waitLonger reports whether the attempt waits another accept timeout
// for the routed replica's accept: slow is not dead. An accept late on a
// starved machine is still coming, and a retry would only send the replica
// the same work again. It waits while the replica looks alive (alive: a
// heartbeat within the last two accept timeouts, where this gateway
// decides), up to AcceptWaits (AcceptWaitsUnseen) accept timeouts in all,
// and within the request's deadline (run's context). A gateway that
// decides and whose own link has not answered since the request went out
// waits too: the silence may be its own.
func (l *leg) waitLonger() bool {
	limit := AcceptWaits
	if l.g.dec == nil {
		limit = AcceptWaitsUnseen
	}
	since := time.Now().Add(-2 * l.g.cfg.AcceptTimeout)
	if l.waits+1 >= limit || l.left {
		return false
	}
	if !l.routedAlive(since) && (l.g.dec == nil || l.g.linkAnsweredSince(l.send.copies[0].at)) {
		// Silent, and not for want of this gateway's own link: where it
		// decides, a replica unheard while the link itself has not
		// answered since the request went out (cut, its server frozen:
		// every heartbeat stops) is waited on until the link says which,
		// and a link given up fails the request as lost, for another
		// gateway to take.
		return false
	}
	l.waits++
	l.g.metrics.acceptWaits.Inc()
	if l.send.direct {
		// The request once more, under the same id, in case the first
		// was lost on the way (a route to a server that was cut): an
		// adapter that has it already drops this one.
		if err := l.g.nc.PublishMsg(l.send.msg); err == nil {
			l.g.metrics.acceptResends.Inc()
		}
	}
	l.timer.Reset(l.g.cfg.AcceptTimeout)
	return true
}

// routedAlive reports whether the routed replica looks alive. A gateway
// that decides reads its heartbeats: alive is ready and heard since since
// (a frozen replica's heartbeats stop; a starved one's come late but
// come). Otherwise it has no heartbeats to read, and sends a probe
// instead: an empty cancel on the replica's cancel subject, with the
// attempt's reply subject, which a live adapter answers present, and to
// which the server answers no-responders when nothing listens there (on
// then fails the attempt as gone). The replica is taken as alive until the
// next accept timeout, when a probe that had no answer by then says it is
// cut off or frozen, not slow: a replica whose server was cut stays
// subscribed at the others until their routes give it up (seconds), and
// the request forwarded to it meanwhile is lost.
func (l *leg) routedAlive(since time.Time) bool {
	if l.g.dec != nil {
		return l.g.dec.Router().HeardSince(l.routed, since, time.Now())
	}
	if l.watch.absent {
		return false
	}
	l.watch.absent = true
	l.g.probe(l.routed, l.reply())
	return true
}

// copyLonger reports whether an attempt no broker spoke for waits another
// accept timeout, sending copies on meanwhile. NATS hands each copy to a
// queue member of its choice, and after a NATS server is cut the cut
// server's brokers stay members at the others until their routes give up
// (seconds): with two brokers, one of them cut, the four copies of one
// accept timeout all go to it for one request in sixteen. Waiting on is a
// retry that costs no replica any work, so it takes copies' budget, not
// the retries': up to AcceptWaitsUnseen accept timeouts in all, and only
// while the attempt holds a unit of the copies' budget.
func (l *leg) copyLonger() bool {
	if !l.send.budget || l.send.spoken || l.left || l.send.waits+1 >= AcceptWaitsUnseen {
		return false
	}
	l.send.waits++
	l.g.metrics.routeWaits.Inc()
	l.timer.Reset(l.g.cfg.AcceptTimeout)
	if l.send.resend == nil && len(l.send.copies) < MaxCopies {
		l.send.resend = time.NewTimer(0)
	}
	return true
}

// reply is the reply subject of the attempt's copy.
func (l *leg) reply() string { return l.g.replyPfx + l.send.copies[l.send.chosen].id }

// sendCopy publishes another copy of the request, with a request id of its
// own, while no broker has spoken for one; and sets the timer of the next.
func (l *leg) sendCopy() {
	l.send.resend = nil
	if l.send.spoken || l.left {
		return
	}
	if !l.send.budget {
		if !l.g.budget.acquireCopy() {
			return // too many attempts send copies: wait as before
		}
		l.send.budget = true
	}
	id := nuid.Next()
	h := make(nats.Header, len(l.send.msg.Header))
	for k, v := range l.send.msg.Header {
		h[k] = v
	}
	h[subjects.HdrRequestID] = []string{id}
	l.g.disp.add(l.c, id)
	l.g.cfg.Stages.Copy(l.send.copies[0].id, id)
	l.g.cfg.Stages.Mark(id, stages.Published) // before the write, as publish
	if err := l.g.nc.PublishMsg(&nats.Msg{Subject: l.send.msg.Subject, Reply: l.g.replyPfx + id, Header: h, Data: l.send.msg.Data}); err != nil {
		l.g.cfg.Stages.End(id)
		return
	}
	l.send.copies = append(l.send.copies, sentCopy{id: id, at: time.Now()})
	l.g.metrics.resends.Inc()
	// The next a routed timeout after this one was due, counted from
	// the first: a timer late on a busy machine sends no fewer copies.
	next := time.Duration(len(l.send.copies)) * l.g.cfg.RoutedTimeout
	if len(l.send.copies) < MaxCopies && next < time.Duration(l.send.waits+1)*l.g.cfg.AcceptTimeout {
		l.send.resend = time.NewTimer(time.Until(l.send.copies[0].at.Add(next)))
	}
}

// mine reports whether a frame that came on subject is the attempt's: the
// first a broker sends for any copy chooses that copy; after that, frames of
// the other copies are not, and a replica one was routed to is told to
// cancel it.
func (l *leg) mine(subject string, f reply.Frame) bool {
	id := subject[strings.LastIndexByte(subject, '.')+1:]
	i := slices.IndexFunc(l.send.copies, func(c sentCopy) bool { return c.id == id })
	if i < 0 {
		return false // a copy whose publication failed
	}
	if !l.send.spoken {
		if f.Kind == reply.Unknown || f.Kind == reply.Keepalive || f.Kind == reply.Present {
			return i == l.send.chosen
		}
		l.send.spoken, l.send.chosen = true, i
		// The stages the gateway stamps from now on are the chosen
		// copy's.
		l.out.attempt = id
		l.stopResending()
		if i > 0 && l.phase == phaseSent {
			// Its accept is due an accept timeout after its own
			// publication.
			l.timer.Reset(time.Until(l.send.copies[i].at.Add(l.g.cfg.AcceptTimeout)))
		}
		return true
	}
	if i == l.send.chosen {
		return true
	}
	switch f.Kind {
	case reply.Routed:
		l.g.cancelLate(f.Replica, id)
	case reply.Accept, reply.Head:
		if f.Replica != "" && subjects.ValidToken(f.Replica) == nil {
			// Its routed notice is still on the way (or was lost).
			l.g.cancelUpstream(f.Replica, id)
		}
	}
	return false
}

// stopResending sends no more copies and gives the copies' budget back.
func (l *leg) stopResending() {
	if l.send.resend != nil {
		l.send.resend.Stop()
		l.send.resend = nil
	}
	if l.send.budget {
		l.g.budget.releaseCopy()
		l.send.budget = false
	}
}

// on handles one reply frame in the attempt's phase; over reports that
// the attempt ended, and r how.
func (l *leg) on(f reply.Frame) (r result, over bool) {
	switch f.Kind {
	case reply.Keepalive:
		if l.phase != phaseSent {
			// A keepalive repeats the last seq sent: slow, not dead.
			l.heard()
			l.out.alive()
		}
		return r, false
	case reply.Present:
		// The routed replica answered a probe: it is on the bus. That
		// is no progress of an answer, which only its frames show.
		if l.phase == phaseSent && f.Replica == l.routed {
			l.watch.absent = false
		}
		return r, false
	}
	if l.phase == phaseSent {
		switch f.Kind {
		case reply.Routed:
			l.routedTo(f.Replica, f.Header.Get(subjects.HdrRouteBudget))
			if l.left {
				return l.leave(result{replica: l.routed}), true
			}
			return r, false
		case reply.NoResponders:
			return l.noneListens(), true
		case reply.Error:
			return l.rejection(f), true
		case reply.Accept:
			return l.accept(f)
		case reply.Unknown:
			return r, false
		}
		if f.Replica == "" {
			// A message from after the accept, without the accept: it
			// was lost with a NATS connection. The rest is no answer.
			return l.leave(result{kind: failSequenceGap, replica: l.routed, accepted: true, ended: f.End, err: errLostAccept}), true
		}
		// The accept rode on the head: the engine answered within the
		// adapter's accept delay.
		if r, over := l.accept(f); over {
			return r, over
		}
	}
	switch f.Kind {
	case reply.Routed:
		return r, false // the broker's notice, overtaken by the accept
	case reply.NoResponders:
		return l.unanswered()
	case reply.Head, reply.Data, reply.End, reply.Handover:
		// One head, the first message after the accept.
		if (f.Kind != reply.Head || l.phase == phaseAccepted) && l.seq.Next(&f) {
			l.heard()
			return l.answer(f)
		}
	}
	return l.fail(failSequenceGap, errSequenceGap.about(l.replica)), true
}

// routedTo takes the decision that routed the attempt to replica, and what
// is left of the request's budget after its reservation ("" when it is
// under none).
func (l *leg) routedTo(replica, budgetLeft string) {
	l.routed = replica
	if budgetLeft != "" {
		l.out.budgetLeft = budgetLeft
	}
}

// noneListens is NATS's no-responders before the accept.
func (l *leg) noneListens() result {
	if l.routed != "" {
		// Nothing listens on the routed replica's subjects: the forward
		// (or the probe of waitLonger) found it gone. A gateway that
		// decides takes it out of its own candidates until its next
		// heartbeat, if it is silent past dead_after (one kept by the
		// panic threshold), so the next requests do not try it again.
		now := time.Now()
		if l.g.dec != nil {
			l.g.dec.Router().MarkGone(l.routed, now)
		}
		// The first replica gone is retried elsewhere; another, moments
		// later, says the replicas are leaving the bus together (their
		// NATS server died), and they reconnect to another in their own
		// time: the request waits for them (replicasBack).
		kind, u := failNoResponders, l.out.u
		if u.replicasBack(l.g.cfg.OfflineWait, now) {
			kind = failReplicasBack
		}
		u.gone.met(l.routed, now)
		return l.leave(result{kind: kind, replica: l.routed, err: errGone.about(l.routed)})
	}
	// No broker is listening. Soon after the gateway's link came back
	// for the request, the brokers are reconnecting in their own time:
	// the request waits for them (judge), within the offline wait.
	kind := failNoResponders
	if u := l.out.u; !u.linkBack.IsZero() && time.Since(u.linkBack) < l.g.cfg.OfflineWait {
		kind = failBrokersBack
	}
	return l.leave(result{kind: kind, err: errNoBroker})
}

// goneReplicas are a request's replicas on whose subjects nothing
// listened for it, and that failed it no other way since: the first was
// found gone at first, the last at last (zero: none yet).
type goneReplicas struct {
	ids         []string
	first, last time.Time
	waits       int  // the waits for them (awaitGone)
	counted     bool // the request is counted in switchyard_gateway_replica_waits_total
}

// met records replica found gone at now.
func (g *goneReplicas) met(replica string, now time.Time) {
	if g.first.IsZero() {
		g.first = now
	}
	g.last = now
	if !slices.Contains(g.ids, replica) {
		g.ids = append(g.ids, replica)
	}
}

// replicasBack reports whether the request met a replica gone from the bus
// less than wait ago, and one still counts as gone (none failed it
// otherwise since): its replicas may be reconnecting to another NATS
// server. It waits for them as long as for its own link (OfflineWait),
// and not past its deadline, so a request that cannot wait gets the
// failure it has.
func (u *upstream) replicasBack(wait time.Duration, now time.Time) bool {
	return len(u.gone.ids) > 0 && now.Before(u.goneEnd(wait))
}

// excludeFailed leaves replica out of the request's next attempts for a
// failure of its own: it is no longer one of the gone, which a wait for
// them makes candidates again.
func (u *upstream) excludeFailed(replica string) {
	u.exclude = append(u.exclude, replica)
	u.gone.ids = slices.DeleteFunc(u.gone.ids, func(id string) bool { return id == replica })
}

// goneEnd is when the request stops waiting for its gone replicas.
func (u *upstream) goneEnd(wait time.Duration) time.Time {
	end := u.gone.first.Add(wait)
	if last := u.deadline.Add(-offlinePoll); last.Before(end) {
		end = last
	}
	return end
}

// awaitGone holds a request that found no replica left once its gone ones
// were left out (replicasBack), until one of them may be back, and makes
// them candidates again. A gateway that decides reads their heartbeats
// (an adapter back on a server sends one at once): it waits, looking every
// offlinePoll, for one heard since the last was found gone, so the
// request is decided again only when it can go somewhere, and spends no
// quota or budget on decisions meanwhile. One that does not sees no
// heartbeats, and asks the brokers again after a pause that doubles from
// twice offlinePoll. The wait ends with the window (goneEnd) or the
// request's context.
func (g *Gateway) awaitGone(ctx context.Context, u *upstream) {
	end := u.goneEnd(g.cfg.OfflineWait)
	if g.dec == nil {
		u.gone.waits++
		pause(ctx, min(offlinePoll<<min(u.gone.waits, 6), max(time.Until(end), 0)))
	} else {
		poll := time.NewTicker(offlinePoll)
		defer poll.Stop()
		for !g.goneHeard(u) && time.Now().Before(end) {
			select {
			case <-ctx.Done():
				return
			case <-poll.C:
			}
		}
	}
	u.exclude = slices.DeleteFunc(u.exclude, func(id string) bool { return slices.Contains(u.gone.ids, id) })
}

// goneHeard reports whether the deciding gateway heard a heartbeat of one
// of the request's gone replicas since the last was found gone.
func (g *Gateway) goneHeard(u *upstream) bool {
	now := time.Now()
	for _, id := range u.gone.ids {
		if g.dec.Router().HeardSince(id, u.gone.last, now) {
			return true
		}
	}
	return false
}

// leave is r, unless the client left while the request was being routed:
// then nothing is left to tell it, and r only names what to cancel.
func (l *leg) leave(r result) result {
	if l.left {
		return result{kind: failClientGone, replica: r.replica, accepted: r.accepted, ended: r.ended}
	}
	return r
}

// accept starts the relay of the replica that accepted. An accept that
// does not name a replica as a subject token can name none: it is no
// accept, and the attempt waits on for one.
func (l *leg) accept(f reply.Frame) (r result, over bool) {
	if subjects.ValidToken(f.Replica) != nil {
		l.g.log.Debug("accept naming no valid replica ignored", "replica", clip.Text(f.Replica, 64))
		return r, false
	}
	if l.left {
		return l.leave(result{replica: f.Replica, accepted: true, ended: f.End}), true
	}
	l.phase, l.replica = phaseAccepted, f.Replica
	l.seq.Accept()
	if u := l.out.u; !u.accepted {
		u.accepted = true
		if u.admitted {
			// The router's part is over: the first attempt's time
			// from going out to its accept, less what the adapter says
			// it held the accept back for its engine's head
			// (Llm-Held), is a sample of the limit's latency. An accept
			// that does not say, or says more than the whole time, is
			// no sample.
			if u.tries == 1 {
				now := time.Now()
				if rtt := now.Sub(l.send.copies[0].at); f.Held >= 0 && f.Held <= rtt {
					l.g.conc.observe(rtt-f.Held, now)
				}
			}
			l.g.conc.accepted(u.tenant)
		}
	}
	l.timer.Reset(l.g.cfg.IdleTimeout)
	if p := l.g.cfg.ProbeAfter; p > 0 && p < l.g.cfg.IdleTimeout {
		l.watch.probe = time.NewTimer(p)
	}
	return r, false
}

// stop stops the leg's timers and gives back what it holds.
func (l *leg) stop() {
	l.timer.Stop()
	if l.watch.probe != nil {
		l.watch.probe.Stop()
	}
	l.stopResending()
}

// rejection is the result of a broker's or an adapter's rejection f: a
// cold model to hold for; a replica that turned the request away (full,
// all_replicas_busy, or draining, no_replicas), to retry elsewhere; for a
// continuation no broker could place, the failure it resumed from; else
// the rejection for the client.
func (l *leg) rejection(f reply.Frame) result {
	if l.left {
		return l.leave(result{ended: true}) // rejected: nothing started
	}
	status := cmp.Or(f.Status, 502)
	rep := f.Header.Get(subjects.HdrRouteReplica)
	switch {
	case l.out.cont == nil && l.g.holdable(f):
		return result{kind: failCold, ended: true, rejection: &f, err: rejectionError(f)}
	case rep != "" && (status == 429 || status == 503):
		e := errBusy.about(rep, "")
		if rejectionError(f).Code == subjects.CodeNoReplicas {
			e = errDraining.about(rep)
		}
		e.retryAfter = retryAfter(f.Header)
		return result{kind: failRefused, replica: rep, ended: true, err: e}
	case l.out.cont != nil:
		l.g.log.Info("cannot resume", "why", cmp.Or(rejectionError(f).Message, "status "+strconv.Itoa(status)))
		return result{kind: failUnplaced, ended: true, err: cmp.Or(l.out.failed, error(errUnplaced))}
	case rejectionError(f).Code == subjects.CodeNoReplicas && l.out.u.replicasBack(l.g.cfg.OfflineWait, time.Now()):
		// None is left because the ones that left the bus moments ago
		// were left out: the request waits for them.
		return result{kind: failReplicasBack, ended: true, err: rejectionError(f)}
	}
	return result{kind: failRejected, ended: true, rejection: &f, err: rejectionError(f)}
}

// heard restarts the silence timers: the replica is alive.
func (l *leg) heard() {
	l.timer.Reset(l.g.cfg.IdleTimeout)
	if l.watch.probe != nil {
		l.watch.probe.Reset(l.g.cfg.ProbeAfter)
	}
	l.watch.missed, l.watch.asked = 0, false
}

// probesToFail is how many probes in a row must find nothing on a silent
// replica's subjects before its answer fails as gone.
const probesToFail = 2

// askReplica sends the silence probe.
func (l *leg) askReplica() {
	if l.watch.asked {
		l.watch.missed = 0 // the last probe found the adapter there
	}
	l.watch.asked = true
	l.g.probe(l.replica, l.reply())
	l.watch.probe.Reset(l.g.cfg.ProbeAfter)
}

// unanswered is NATS's no-responders to the silence probe: nothing
// listens on the replica's subjects. One that answers no probe says
// nothing.
func (l *leg) unanswered() (r result, over bool) {
	if !l.watch.asked {
		return r, false
	}
	l.watch.asked = false
	if l.watch.missed++; l.watch.missed < probesToFail {
		l.watch.probe.Reset(l.g.cfg.ProbeAfter / 5)
		return r, false
	}
	return l.fail(failGone, errGone.about(l.replica)), true
}

// answer handles the accepted replica's next message in sequence.
func (l *leg) answer(f reply.Frame) (r result, over bool) {
	if f.Kind == reply.Handover {
		// Handed back, with or without a head before it.
		r = l.fail(failHandover, errHandover.about(l.replica))
		r.ended = true
		return r, true
	}
	if f.Kind == reply.Head {
		l.g.cfg.Stages.Mark(l.out.attempt, stages.GatewayFirstChunk)
		refused, err := l.out.head(f, l.replica)
		switch {
		case refused != nil:
			r = l.fail(failRefused, refused)
			r.ended = f.End
			return r, true
		case err != nil:
			r = l.fail(failClientGone, nil) // gone as the head was flushed
			r.ended = f.End
			return r, true
		}
		// A head may carry the body and the end too: a non-streamed
		// answer, or an adapter that failed before the engine answered.
		l.phase = phaseStreaming
	}
	if len(f.Body) > 0 {
		if err := l.out.data(f.Body); err != nil {
			switch {
			case errors.Is(err, errEngineEvent):
				r = l.fail(failEngine, errEngine.about(""))
			case errors.Is(err, sse.ErrEventTooLarge):
				r = l.fail(failEngine, errEventSize.about(l.replica, err))
			case errors.Is(err, os.ErrDeadlineExceeded):
				// The client stopped reading (the write deadline passed)
				// or went away: only its own stream ends.
				r = l.fail(failClientWrite, nil)
			default:
				r = l.fail(failClientGone, nil)
			}
			r.ended = f.End
			return r, true
		}
	}
	if !f.End {
		return r, false
	}
	if f.Err != "" {
		r = l.fail(failEngine, errEngine.about(": "+f.Err))
	} else if held, ok := l.out.heldError(); ok {
		// A held stream the replica answered with an error: it is
		// rejected, in the stream's error event (judge).
		r = l.fail(failRejected, rejectionError(held))
		r.rejection = &held
	} else {
		l.out.finish()
		r = result{replica: l.replica, accepted: true}
	}
	r.ended = true
	return r, true
}

// fail is the result of a failure after the accept.
func (l *leg) fail(kind failure, err error) result {
	return result{kind: kind, err: err, replica: l.replica, accepted: true}
}

// probe asks whether anything still listens on replica's cancel subject:
// an empty cancel (no request id) with the attempt's reply subject and
// Llm-Probe, which a live adapter answers present, and to which the server
// answers no-responders when the adapter is gone (relay).
func (g *Gateway) probe(replica, reply string) {
	_ = g.nc.PublishMsg(&nats.Msg{Subject: g.subj.ReplicaCancel(replica), Reply: reply, Header: nats.Header{subjects.HdrProbe: {"1"}}})
}

// lateRoute takes a message on a reply subject no attempt waits for: a
// routed notice there is a copy a broker routed after another copy of its
// request was taken or after the attempt ended (a stalled broker catching
// up, a healed link delivering what it held), and its replica is told to
// cancel it. The rest is dropped.
func (g *Gateway) lateRoute(id string, m *nats.Msg) {
	if f, ok := g.decode(m); ok && f.Kind == reply.Routed {
		g.cancelLate(f.Replica, id)
	}
}

// decode reads a message of an attempt's mailbox. A routed notice is
// believed only from the gateway's routed subject, which only brokers may
// publish: on the reply subject, where adapters publish too, it could be an
// adapter's, naming a replica to cancel or to blame for a request whose id
// it learned (docs/security.md). Such a notice is dropped (ok false) and
// counted.
func (g *Gateway) decode(m *nats.Msg) (f reply.Frame, ok bool) {
	g.cfg.Stages.ReplyLeg(m)
	f = reply.Decode(m)
	if f.Kind == reply.Routed && !strings.HasPrefix(m.Subject, g.routedPfx) {
		g.metrics.refusedNotices.Inc()
		return f, false
	}
	if f.Kind != reply.Routed && strings.HasPrefix(m.Subject, g.routedPfx) {
		return f, false // only notices come there
	}
	return f, true
}

// cancelLate cancels a copy routed to replica after it was no longer
// wanted. The replica id comes from a broker's notice: one that is not a
// subject token is not published to.
func (g *Gateway) cancelLate(replica, id string) {
	if subjects.ValidToken(replica) != nil {
		return
	}
	g.metrics.lateRoutes.Inc()
	g.cancelUpstream(replica, id)
}

// resumedFrom tells the adapter of the failed part id that its answer
// continues on another replica: the record it holds of that part is
// dropped, since the continuation's record holds the whole request
// (docs/protocol.md, "The ledger").
func (g *Gateway) resumedFrom(replica, id string) {
	if id == "" || subjects.ValidToken(replica) != nil {
		return
	}
	m := nats.NewMsg(g.subj.ReplicaCancel(replica))
	m.Header.Set(subjects.HdrRequestID, id)
	m.Header.Set(subjects.HdrResume, replica)
	_ = g.nc.PublishMsg(m)
}

// cancelUpstream tells the adapter to stop the engine call.
func (g *Gateway) cancelUpstream(replica, id string) {
	m := nats.NewMsg(g.subj.ReplicaCancel(replica))
	m.Header.Set(subjects.HdrRequestID, id)
	_ = g.nc.PublishMsg(m)
}
