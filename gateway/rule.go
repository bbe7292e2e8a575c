package gateway

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/subjects/reply"
)

// failure is how an attempt ended, failNone being a whole answer. Every
// kind maps to one verdict by judge, the relay's only rule; TestJudge has
// a row for each (TestJudgeRowsEveryKind reads this block).
type failure uint8

const (
	failNone          failure = iota // the client has its answer
	failOffline                      // the gateway is not connected to NATS: not even tried
	failNoResponders                 // no broker listens on llm.gw.<tenant>, or nothing on the routed replica's subjects
	failBrokersBack                  // no broker listens yet, moments after the gateway's NATS link came back
	failReplicasBack                 // the request's replicas left the bus moments ago: they may be reconnecting
	failNotRouted                    // no broker routed the request within the accept timeout
	failAcceptTimeout                // the routed replica did not accept within the accept timeout
	failRefused                      // a replica or its engine turned the request away (429/503)
	failSequenceGap                  // a reply message was lost
	failSilence                      // the replica went silent past the idle timeout
	failGone                         // the replica went silent and nothing listens on its subjects
	failEngine                       // the engine failed mid-response (Llm-Error on the end)
	failLost                         // the NATS connection dropped with the request in flight
	failOverflow                     // the client read too slowly; its mailbox overflowed
	failDeadline                     // the request deadline passed
	failClientGone                   // the client went away
	failClientWrite                  // a write to the client timed out: it stopped reading
	failHandover                     // the replica drained and handed the unfinished answer back
	failUnplaced                     // no broker could place a continuation (no other replica)
	failCold                         // model_loading for a model whose on_cold is wait: hold the request
	failRejected                     // a broker or replica rejected the request: the client gets the rejection
)

// resumable reports whether an answer that failed this way may continue
// on another replica: the replica failed, not the client or NATS.
func (f failure) resumable() bool {
	switch f {
	case failSequenceGap, failSilence, failGone, failEngine, failHandover:
		return true
	}
	return false
}

// cause labels switchyard_gateway_stream_errors_total for failures after
// the accept; "" is not counted there.
func (f failure) cause() string {
	switch f {
	case failSequenceGap:
		return "sequence_gap"
	case failSilence:
		return "idle_timeout"
	case failGone:
		return "replica_gone"
	case failEngine:
		return "engine"
	case failLost:
		return "nats_disconnect"
	case failOverflow, failClientWrite:
		return "slow_client"
	case failHandover:
		return "handover"
	}
	return ""
}

// result is what one attempt, or a hold, returns to the relay.
type result struct {
	kind failure
	// err is what the client is told, if anything: one of the named
	// errors below, or the refusal or rejection a replica or broker sent
	// (*subjects.APIError).
	err error
	// replica is the replica the attempt reached ("" when none was named);
	// it is cancelled unless ended, left out of a retry after a failure or
	// a refusal, and tried again after an accept timeout only when no
	// other replica is left.
	replica  string
	accepted bool // the replica accepted: its reply is on the way
	ended    bool // the reply's end (Llm-Eos) arrived: nothing left to cancel
	wrote    bool // bytes reached the client
	// cont is the body of the continuation when the answer can continue
	// on another replica (nil: it cannot): the request allows it and the
	// answer so far can be carried.
	cont []byte
	// rejection is the rejection of a failCold or failRejected, as the
	// broker or replica sent it.
	rejection *reply.Frame
	// id is the request id of the attempt's copy the result is of (""
	// when no copy was sent): the one a cancel names.
	id string
}

// verdict is what the relay does with a result.
type verdict uint8

const (
	answered  verdict = iota // the client has its whole answer
	retry                    // the replica did no work and another may serve it
	resume                   // the replica failed mid-answer: continue it on another
	httpError                // nothing reached the client: an HTTP error in the OpenAI shape
	endStream                // bytes reached the client: an SSE error event ends the stream
	abandon                  // the client is gone: nothing left to tell it
	hold                     // the model is loading: hold the request until it is ready
	rejected                 // nothing reached the client: the rejection, copied whole
	wait                     // the brokers are reconnecting: try again after a poll, spending no retry
)

func (v verdict) String() string {
	return [...]string{"answered", "retry", "resume", "http_error", "end_stream", "abandon", "hold", "rejected", "wait"}[v]
}

// budgets is what a request may still spend on attempts after its first:
// retries, at most MaxRetries, each holding a unit of the gateway's retry
// budget (shared) for its try, but for the retry of an attempt nothing
// listened for (retryUnheard); and resumes, at most maxResumes, each
// needing that budget open but not holding it (a resume continues work
// already admitted, so a drain can hand over every stream at once). judge
// takes from it; the relay gives a retry's unit back when its try is over
// (held).
type budgets struct {
	retries, resumes int
	shared           *retryBudget
	held             bool // the retry under way holds a unit of shared
}

// retry takes a retry, if one is left.
func (b *budgets) retry() bool {
	if b.retries <= 0 || !b.shared.acquire() {
		return false
	}
	b.retries--
	b.held = true
	return true
}

// retryUnheard takes a retry for an attempt nothing listened for (NATS
// answered no-responders): no replica has the request, so its retry adds
// no work to any, and it spends the request's own retries only. The
// shared budget is for retries that may double a replica's work; a loss
// that strikes many requests at once (a site's replicas gone from the
// bus under a burst of requests to them) would run it out, and the
// requests would fail although the model's fallbacks could serve them.
func (b *budgets) retryUnheard() bool {
	if b.retries <= 0 {
		return false
	}
	b.retries--
	b.held = false
	return true
}

// release gives back the unit the retry under way holds, if it holds one.
func (b *budgets) release() {
	if b.held {
		b.shared.release()
		b.held = false
	}
}

// resume takes a resume, if one is left and the retry budget is open.
func (b *budgets) resume() bool {
	if b.resumes <= 0 || !b.shared.acquire() {
		return false
	}
	b.shared.release()
	b.resumes--
	return true
}

// judge is the relay's one rule, in one place as in httputil.ReverseProxy:
// every result of an attempt or a hold comes here, and what it returns is
// what the relay does. A failure before the replica did any work is
// retried on another replica while the budgets allow (a retry of a
// continuation is still a continuation); a replica that failed mid-answer
// is resumed on another when the request allows it and the budgets do;
// otherwise an HTTP error before the first byte, and after it the stream
// ends with an explicit error event, never a silent truncation. A request
// for a cold model that says to wait is held; a rejection the client gets
// goes to it as it came, or as the error event of a stream already begun
// (a held one).
func judge(r result, b *budgets) verdict {
	switch r.kind {
	case failNone:
		return answered
	case failClientGone, failClientWrite:
		return abandon
	case failCold:
		return hold
	case failBrokersBack, failReplicasBack:
		return wait
	case failRejected:
		if !r.wrote {
			return rejected
		}
	case failNoResponders:
		if b.retryUnheard() {
			return retry
		}
	case failNotRouted, failAcceptTimeout, failRefused:
		if b.retry() {
			return retry
		}
	case failLost:
		// Before the accept no replica has the request for sure; after
		// it, a retry could run it twice.
		if !r.accepted && b.retry() {
			return retry
		}
	default:
		if r.accepted && r.kind.resumable() && r.cont != nil && b.resume() {
			return resume
		}
	}
	if r.wrote {
		return endStream
	}
	return httpError
}

// settle applies a result's side effects that do not depend on the
// verdict: the cancel of a replica still working, the exclusion of one that
// failed or turned the request away, the avoidance of one that was slow to
// accept, and the metrics. Slow is not dead: a replica that did not accept in time is a
// candidate still, behind every other (Llm-Avoid), so a request whose only
// replica is slow goes to it again instead of failing no_replicas; the
// decider, which reads the heartbeats, leaves it out when they stopped too
// (policy.SilentAfter: cut off, frozen), so the request goes to the
// fallbacks.
func (g *Gateway) settle(u *upstream, id string, r result) {
	g.cfg.Stages.End(id)
	if r.kind == failNone {
		return
	}
	if r.replica != "" && !r.ended {
		g.cancelUpstream(r.replica, id)
	}
	switch r.kind {
	case failAcceptTimeout:
		g.metrics.acceptTimeouts.Inc()
		if r.replica != "" && !slices.Contains(u.avoid, r.replica) {
			u.avoid = append(u.avoid, r.replica)
		}
	case failNoResponders:
		if r.replica != "" {
			u.exclude = append(u.exclude, r.replica)
		}
	case failReplicasBack:
		// Another replica gone from the bus is left out like the first;
		// when none is left (no_replicas), the relay waits for the gone
		// ones and makes them candidates again (awaitGone).
		if !u.gone.counted {
			u.gone.counted = true
			g.metrics.replicaWaits.Inc()
		}
		if r.replica != "" {
			u.exclude = append(u.exclude, r.replica)
		}
	case failRefused:
		// A replica that turned the request away (full, or draining)
		// is left out of the retry, so another replica, or the model's
		// fallbacks, serve it. A full one is remembered: a request that
		// then finds no replica left was refused for want of room, not
		// of replicas (conclude).
		if r.replica != "" {
			u.excludeFailed(r.replica)
			if errors.Is(r.err, errBusy) {
				u.busy = r.err
			}
		}
	case failSequenceGap, failSilence, failGone, failEngine, failHandover:
		if r.replica != "" {
			u.excludeFailed(r.replica)
		}
	case failClientGone:
		g.metrics.clientGone.Inc()
	}
	if c := r.kind.cause(); c != "" && r.accepted {
		g.metrics.streamErrors.WithLabelValues(c).Inc()
	}
}

// conclude writes what the final verdict v on r leaves to say.
func (g *Gateway) conclude(out *response, r result, v verdict) {
	if out.budgetLeft != "" && !out.wrote {
		// An answer under a budget says what is left of it, an error the
		// replica or the gateway made included.
		out.w.Header().Set(subjects.HdrBudgetRemaining, out.budgetLeft)
	}
	switch v {
	case rejected:
		if busy := out.u.busy; busy != nil && rejectionError(*r.rejection).Code == subjects.CodeNoReplicas {
			// No replica was left only because the ones tried were
			// full: all_replicas_busy, with the engine's Retry-After,
			// says what happened; "no replica is available" would blame
			// replicas that are alive.
			g.fail(out.w, out.u, apiError(busy))
			return
		}
		out.passRejection(*r.rejection)
	case httpError:
		e := apiError(r.err)
		if (r.kind == failOffline || r.kind == failLost) && !out.u.accepted {
			// The gateway's link is down and no replica's accept of
			// any attempt reached it: as judge lets this gateway send it
			// again (failLost), another gateway may take it as it is (a
			// load balancer retrying on this header).
			e.Headers = map[string]string{HdrRetryElsewhere: "1"}
		}
		g.fail(out.w, out.u, e)
	case endStream:
		out.endStream(apiError(r.err))
		if r.kind == failOverflow {
			// A client that stopped reading would keep its connection
			// for as long as it likes: once told of the cut (as far as
			// it reads), the connection is closed (HTTP/1) or the stream
			// reset (HTTP/2), never left open for the next request. (A
			// failed write, failClientWrite, is abandoned and net/http
			// closes that connection itself.)
			panic(http.ErrAbortHandler)
		}
	}
}

// relayError is a failure the gateway names itself. The values below are
// the names, compared with errors.Is; about makes one of them specific
// (the replica it concerns), still Is the name. apiError renders it.
type relayError struct {
	status     int
	code       string
	msg        string        // what the client reads; a format for about where it has verbs
	retryAfter time.Duration // the hint with it (0: none)
	name       *relayError   // the named value this one is of (nil: it is one)
}

func (e *relayError) Error() string { return e.msg }

// Is reports whether target is the named value e is of.
func (e *relayError) Is(target error) bool { return e.name != nil && error(e.name) == target }

// about is e with its message's format filled in.
func (e *relayError) about(args ...any) *relayError {
	c := *e
	c.msg, c.name = fmt.Sprintf(e.msg, args...), e
	return &c
}

// The failures the gateway names.
var (
	errOffline      = &relayError{status: 503, code: subjects.CodeRouterUnavailable, msg: "the gateway is not connected to NATS", retryAfter: time.Second}
	errLinkSilent   = &relayError{status: 503, code: subjects.CodeRouterUnavailable, msg: "the gateway's NATS link is silent (no pong to %d pings in a row, %s apart)", retryAfter: time.Second}
	errPublish      = &relayError{status: 503, code: subjects.CodeRouterUnavailable, msg: "NATS unavailable: %v"}
	errLost         = &relayError{status: 503, code: subjects.CodeRouterUnavailable, msg: "the gateway lost its NATS connection while the request was in flight", retryAfter: time.Second}
	errNoBroker     = &relayError{status: 503, code: subjects.CodeRouterUnavailable, msg: "no broker is available"}
	errNotRouted    = &relayError{status: 504, code: subjects.CodeUpstreamTimeout, msg: "no broker routed the request in time"}
	errNotAccepted  = &relayError{status: 504, code: subjects.CodeUpstreamTimeout, msg: "replica %s did not accept the request in time"}
	errBusy         = &relayError{status: 503, code: subjects.CodeAllReplicasBusy, msg: "replica %s turned the request away%s"}
	errDraining     = &relayError{status: 503, code: subjects.CodeNoReplicas, msg: "replica %s turned the request away"}
	errLostAccept   = &relayError{status: 502, code: subjects.CodeUpstreamError, msg: "the reply lost its accept (sequence gap)"}
	errSequenceGap  = &relayError{status: 502, code: subjects.CodeUpstreamError, msg: "reply from %s lost a message (sequence gap)"}
	errSilence      = &relayError{status: 504, code: subjects.CodeUpstreamTimeout, msg: "replica %s went silent"}
	errGone         = &relayError{status: 502, code: subjects.CodeUpstreamError, msg: "replica %s is gone (nothing listens on its subjects)"}
	errEngine       = &relayError{status: 502, code: subjects.CodeUpstreamError, msg: "engine failed mid-response%s"}
	errEventSize    = &relayError{status: 502, code: subjects.CodeUpstreamError, msg: "replica %s: %v"}
	errHandover     = &relayError{status: 502, code: subjects.CodeUpstreamError, msg: "replica %s drained before the answer ended"}
	errNotContinued = &relayError{status: 502, code: subjects.CodeUpstreamError, msg: "replica %s did not continue the stream (status %d)"}
	errUnplaced     = &relayError{status: 502, code: subjects.CodeUpstreamError, msg: "the answer could not continue on another replica"}
	errEarlyFlood   = &relayError{status: 502, code: subjects.CodeUpstreamError, msg: "the reply overflowed before the replica accepted"}
	errSlowClient   = &relayError{status: 502, code: subjects.CodeUpstreamError, msg: "the client read too slowly; the stream was cut"}
	errDeadline     = &relayError{status: http.StatusGatewayTimeout, code: subjects.CodeUpstreamTimeout, msg: "the request deadline passed%s"}
)

// apiError is what the client is told of err, in the OpenAI shape: a new
// value, which the caller may add headers to. nil stays nil.
func apiError(err error) *subjects.APIError {
	var ae *subjects.APIError
	if err == nil || errors.As(err, &ae) {
		if ae != nil {
			c := *ae
			return &c
		}
		return nil
	}
	var re *relayError
	if !errors.As(err, &re) {
		return subjects.NewError(502, subjects.CodeUpstreamError, err.Error())
	}
	return &subjects.APIError{Status: re.status, Code: re.code, Message: re.msg, RetryAfter: re.retryAfter}
}

// errOverloaded refuses a request past the gateway's concurrency limit.
func errOverloaded() *subjects.APIError {
	e := subjects.NewError(503, subjects.CodeGatewayOverloaded, "The gateway is at its limit of open requests; retry later.")
	e.RetryAfter = time.Second
	return e
}
