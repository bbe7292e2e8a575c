package policy

import (
	"math"
	"strconv"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// Retry-After hints. The router never queues (a second queue hides state
// from the engine's scheduler, which knows better): it rejects with a hint.
const (
	RetryNoTable     = 1 * time.Second
	RetryNoReplicas  = 5 * time.Second
	RetryWarming     = 5 * time.Second  // a registered replica is loading
	RetryColdLoad    = 30 * time.Second // a cold-tier model must be loaded first, nothing known of how long
	RetryColdOverdue = 1 * time.Second  // a load that should be ready by now
	RetryBusyMin     = 1 * time.Second
	RetryBusyMax     = 30 * time.Second
	RetryDeadlineMin = 1 * time.Second
)

// checkContext rejects what the engine would refuse: a prompt that, with
// the completion it asks for (max_tokens), does not fit the model's context.
// The message is worded as vLLM words it, so clients that look for
// "maximum context length" find it whichever part refused.
func (st *decision) checkContext() *subjects.APIError {
	m := st.snap.Models[st.res.target.Model]
	if !overContext(m, st.req) {
		return nil
	}
	q := st.req
	limit := strconv.Itoa(m.MaxContextTokens)
	var msg string
	if q.MaxTokens > 0 {
		msg = "This model's maximum context length is " + limit + " tokens. However, you requested " +
			strconv.Itoa(q.PromptTokens+q.MaxTokens) + " tokens (" + strconv.Itoa(q.PromptTokens) + " in the messages, " +
			strconv.Itoa(q.MaxTokens) + " in the completion). Please reduce the length of the messages or completion."
	} else {
		msg = "This model's maximum context length is " + limit + " tokens. However, your messages resulted in " +
			strconv.Itoa(q.PromptTokens) + " tokens. Please reduce the length of the messages."
	}
	e := subjects.NewError(400, subjects.CodeContextLength, msg)
	e.Param = "messages"
	return e
}

// overContext reports whether the prompt and the completion asked for
// exceed m's context; engines count both.
func overContext(m *table.Model, q *Request) bool {
	return m != nil && m.MaxContextTokens > 0 && q.PromptTokens+max(q.MaxTokens, 0) > m.MaxContextTokens
}

// checkCapacity rejects when every candidate is at capacity, with a
// Retry-After of the shortest estimated wait among them.
func (st *decision) checkCapacity() *subjects.APIError {
	if st.pick.nfull < len(st.pick.cands) {
		return nil
	}
	wait := math.Inf(1)
	for i := range st.pick.cands {
		wait = min(wait, st.pick.cands[i].x.wait)
	}
	e := subjects.NewError(503, subjects.CodeAllReplicasBusy, "Every replica of "+st.res.target.Model+" is at capacity; retry later.")
	e.RetryAfter = min(max(millis(wait), RetryBusyMin), RetryBusyMax)
	return e
}

// deadlineCheck is the deadline check's state: the candidate it switched
// away from, -1 when none.
type deadlineCheck struct{ loser int }

// deadline keeps the chosen replica when its predicted time to first token
// fits before the request's deadline; else it switches to the candidate
// with the lowest prediction if that one fits, or refuses.
func (p *pick) deadline() (switched bool, e *subjects.APIError) {
	p.dl.loser = -1
	if p.req.Deadline.IsZero() {
		return false, nil
	}
	left := p.req.Deadline.Sub(p.now)
	if left > 0 && millis(p.cands[p.chosen].ttft) <= left {
		return false, nil
	}
	best := p.fastest()
	wait := millis(p.cands[best].ttft)
	if left > 0 && wait <= left {
		p.dl.loser, p.chosen = p.chosen, best
		return true, nil
	}
	e = subjects.NewError(503, subjects.CodeDeadlineUnmeetable, "The estimated wait of "+wait.String()+
		" does not fit in the request's remaining time of "+max(left, 0).Round(time.Millisecond).String()+".")
	e.RetryAfter = max(wait-max(left, 0), RetryDeadlineMin)
	return false, e
}

func (p *pick) whyDeadline(i int) string {
	if i == p.dl.loser {
		return WhyDeadline
	}
	return ""
}

// unavailable is the rejection when neither the model nor any fallback has
// a candidate.
func (st *decision) unavailable() *subjects.APIError {
	model := st.res.primary.Model
	var e *subjects.APIError
	m := st.snap.Models[model]
	switch {
	case st.d.ControlLoad && st.d.LoadModel == model:
		e = subjects.NewError(503, subjects.CodeModelLoading, "Model "+model+" is not loaded; it has been requested, retry later.")
		e.RetryAfter = st.coldRetryAfter(model, m)
	case st.loading(model):
		e = subjects.NewError(503, subjects.CodeModelLoading, "Model "+model+" is loading; retry later.")
		e.RetryAfter = RetryWarming
		if !st.r.cold[model].eta.IsZero() {
			e.RetryAfter = st.coldRetryAfter(model, m)
		}
	case st.pick.endpoint.unserved > 0 && !st.anyServes(model):
		e = subjects.NewError(501, subjects.CodeEndpointNotSupported, "No replica of "+model+" serves "+st.req.Endpoint+".")
	case st.pick.region.resident > 0:
		e = errResidency(model, st.res.tenantKey, st.res.tenant)
	default:
		e = subjects.NewError(503, subjects.CodeNoReplicas, "No replica of "+model+" is available.")
		e.RetryAfter = RetryNoReplicas
	}
	if e.Code == subjects.CodeModelLoading {
		// The gateway holds the request instead when the model's on_cold
		// is wait (gateway/coldwait.go): it needs the model's id.
		e.Headers = map[string]string{subjects.HdrRouteModel: model}
	}
	return e
}

// anyServes reports whether a registered replica of model serves the
// request's endpoint, live or not: when none does, waiting will not help.
func (st *decision) anyServes(model string) bool {
	for _, x := range st.r.view.byModel[model] {
		if st.pick.serves(x) {
			return true
		}
	}
	return false
}

// errPreviousResponse is a stored response whose replica cannot serve the
// next turn: no other replica holds it, so it is an explicit error, never
// an answer without the conversation. The policy knows only the replica
// that holds the response, not the response's id.
func errPreviousResponse(replica string) *subjects.APIError {
	e := subjects.NewError(404, subjects.CodePreviousResponseNotFound,
		"The previous response is not available: replica "+replica+" that stored it is gone or draining. Start the conversation again without previous_response_id.")
	e.Param = "previous_response_id"
	return e
}

func errNoTable() *subjects.APIError {
	e := subjects.NewError(503, subjects.CodeRouterUnavailable, "The routing table is not loaded yet.")
	e.RetryAfter = RetryNoTable
	return e
}

func errModelNotFound(name string) *subjects.APIError {
	e := subjects.NewError(404, subjects.CodeModelNotFound, "The model `"+name+"` does not exist.")
	e.Param = "model"
	return e
}

func errNoCascadeRule(alias string) *subjects.APIError {
	e := subjects.NewError(404, subjects.CodeModelNotFound, "No cascade rule of alias `"+alias+"` matches this request.")
	e.Param = "model"
	return e
}

func errAliasLoop(name string) *subjects.APIError {
	e := subjects.NewError(404, subjects.CodeModelNotFound, "Alias `"+name+"` resolves in a loop.")
	e.Param = "model"
	return e
}

func errNotAllowed(tenant, name string) *subjects.APIError {
	e := subjects.NewError(403, subjects.CodeModelNotAllowed, "Tenant "+tenant+" may not use model `"+name+"`.")
	e.Param = "model"
	return e
}

func errBadModel(msg string) *subjects.APIError {
	e := subjects.NewError(400, subjects.CodeInvalidRequest, msg)
	e.Param = "model"
	return e
}

func millis(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }
