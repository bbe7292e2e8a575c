package gateway

import (
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/subjects/reply"
)

// failure is how an attempt ended, failNone being a whole answer. Every
// kind maps to one verdict by judge, the relay's only rule.
type failure uint8

const (
	failNone          failure = iota // the client has its answer (or a rejection copied whole)
	failOffline                      // the gateway is not connected to NATS: not even tried
	failNoResponders                 // no broker listens on llm.route.<tenant>, or nothing on the routed replica's subjects
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

// result is what one attempt returns to the relay.
type result struct {
	kind failure
	err  *subjects.APIError // what the client is told, if anything
	// replica is the replica the attempt reached ("" when none was named);
	// it is cancelled unless ended, left out of a retry after a failure or
	// a refusal, and tried again after an accept timeout only when no
	// other replica is left.
	replica  string
	accepted bool // the replica accepted: its reply is on the way
	ended    bool // the reply's end (Llm-Eos) arrived: nothing left to cancel
	wrote    bool // bytes reached the client
	// resumable: the answer can continue on another replica (the request
	// allows it and the resumes are not spent).
	resumable bool
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
)

func (v verdict) String() string {
	return [...]string{"answered", "retry", "resume", "http_error", "end_stream", "abandon", "hold", "rejected"}[v]
}

// judge is the relay's one rule, in one place as in httputil.ReverseProxy:
// a failure before the replica did any work is retried on another replica
// (a retry of a continuation is still a continuation); a replica that
// failed mid-answer is resumed on another when the request allows it;
// otherwise an HTTP error before the first byte, and after it the stream
// ends with an explicit error event, never a silent truncation. A request
// for a cold model that says to wait is held; a rejection the client gets
// goes to it as it came, or as the error event of a stream already begun
// (a held one).
func judge(r result) verdict {
	switch {
	case r.kind == failNone:
		return answered
	case r.kind == failClientGone || r.kind == failClientWrite:
		return abandon
	}
	switch r.kind {
	case failCold:
		return hold
	case failRejected:
		if !r.wrote {
			return rejected
		}
	case failNoResponders, failNotRouted, failAcceptTimeout, failRefused:
		return retry
	case failLost:
		// Before the accept no replica has the request for sure; after
		// it, a retry could run it twice.
		if !r.accepted {
			return retry
		}
	}
	if r.resumable && r.accepted && r.kind.resumable() {
		return resume
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
// replica is slow goes to it again instead of failing no_replicas. Where
// this gateway decides and the replica's heartbeats stopped too (none
// within the last two accept timeouts: cut off, frozen), it is not slow
// but silent, and is excluded, so the request goes to the fallbacks.
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
		switch {
		case r.replica == "":
		case g.dec != nil && !g.dec.Router().HeardSince(r.replica, time.Now().Add(-2*g.cfg.AcceptTimeout), time.Now()):
			u.exclude = append(u.exclude, r.replica)
		case !slices.Contains(u.avoid, r.replica):
			u.avoid = append(u.avoid, r.replica)
		}
	case failNoResponders:
		if r.replica != "" {
			u.exclude = append(u.exclude, r.replica)
		}
	case failRefused:
		// A replica that turned the request away (full, or draining)
		// is left out of the retry, so another replica, or the model's
		// fallbacks, serve it. A full one is remembered: a request that
		// then finds no replica left was refused for want of room, not
		// of replicas (busyLeftNone).
		if r.replica != "" {
			u.exclude = append(u.exclude, r.replica)
			if r.err != nil && r.err.Code == subjects.CodeAllReplicasBusy {
				u.busy = r.err
			}
		}
	case failSequenceGap, failSilence, failGone, failEngine, failHandover:
		if r.replica != "" {
			u.exclude = append(u.exclude, r.replica)
		}
	case failClientGone:
		g.metrics.clientGone.Inc()
	}
	if c := r.kind.cause(); c != "" && r.accepted {
		g.metrics.streamErrors.WithLabelValues(c).Inc()
	}
}

// busyLeftNone is the refusal a request ends with when its last attempt
// found no replica (no_replicas) only because the ones it tried were full:
// all_replicas_busy, with the engine's Retry-After, says what happened;
// "no replica is available" would blame replicas that are alive.
func busyLeftNone(u *upstream, r result) (result, bool) {
	if u.busy == nil || r.kind != failRejected || r.wrote || r.err == nil || r.err.Code != subjects.CodeNoReplicas {
		return r, false
	}
	return result{kind: failRefused, err: u.busy, ended: true}, true
}

// conclude tells the client what the last attempt's verdict leaves to say.
// A retry or resume left over (its budget spent) ends as an error, as
// judge would have it with none left.
func (g *Gateway) conclude(out *response, r result) {
	v := judge(r)
	if v == retry || v == resume {
		v = httpError
		if r.wrote {
			v = endStream
		}
	}
	if out.budgetLeft != "" && !out.wrote {
		// An answer under a budget says what is left of it, an error the
		// replica or the gateway made included.
		out.w.Header().Set(subjects.HdrBudgetRemaining, out.budgetLeft)
	}
	switch v {
	case rejected:
		out.passRejection(*r.rejection)
	case httpError:
		g.fail(out.w, out.u, r.err)
	case endStream:
		out.endStream(r.err)
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

// Errors of the failures the gateway itself detects.

// errOverloaded refuses a request past the gateway's concurrency limit.
func errOverloaded() *subjects.APIError {
	e := subjects.NewError(503, subjects.CodeGatewayOverloaded, "The gateway is at its limit of open requests; retry later.")
	e.RetryAfter = time.Second
	return e
}

func errOffline() *subjects.APIError {
	e := subjects.NewError(503, subjects.CodeRouterUnavailable, "the gateway is not connected to NATS")
	e.RetryAfter = time.Second
	return e
}

// errSilent is the error of a request sent while the NATS link is silent.
func errSilent(check time.Duration) *subjects.APIError {
	e := subjects.NewError(503, subjects.CodeRouterUnavailable, "the gateway's NATS link is silent (no pong to "+strconv.Itoa(PongsToMiss)+" pings in a row, "+check.String()+" apart)")
	e.RetryAfter = time.Second
	return e
}

// errLost is the error of a request whose replies may have been lost with
// the NATS connection.
func errLost() *subjects.APIError {
	e := subjects.NewError(503, subjects.CodeRouterUnavailable, "the gateway lost its NATS connection while the request was in flight")
	e.RetryAfter = time.Second
	return e
}

// errGone is the error of a replica where nothing listens any more.
func errGone(replica string) *subjects.APIError {
	return subjects.NewError(502, subjects.CodeUpstreamError, "replica "+replica+" is gone (nothing listens on its subjects)")
}

func errDeadline(msg string) *subjects.APIError {
	return subjects.NewError(http.StatusGatewayTimeout, subjects.CodeUpstreamTimeout, msg)
}
