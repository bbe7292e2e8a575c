package decider

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/features"
	"github.com/switchyard-llm/switchyard/owners"
	"github.com/switchyard-llm/switchyard/subjects"
)

// OwnerTimeout bounds the owners-bucket read of one request.
const OwnerTimeout = 2 * time.Second

// checkResponseID refuses a stored response id that cannot be one.
func checkResponseID(id string) *subjects.APIError {
	if !features.ValidResponseID(id) {
		return subjects.NewError(400, subjects.CodeInvalidRequest, subjects.HdrPreviousResponse+" must be a response id")
	}
	return nil
}

// readOwnerFirst is the Action for a request naming stored response id:
// read its owner (owned goes on), unless the id cannot be one or there is
// no owners bucket to read.
func (dec *Decider) readOwnerFirst(id string) Action {
	e := checkResponseID(id)
	if e == nil && dec.owners == nil {
		e = errUnknownResponse(id)
	}
	if e != nil {
		dec.metrics.rejected(e.Code)
		return refuse(e)
	}
	return Action{Do: DoReadOwner, Owner: id}
}

// readOwner reads which replica holds stored response id for tenant.
// Another tenant's response is as unknown as a missing one.
func (dec *Decider) readOwner(tenant, id string) (owners.Record, *subjects.APIError) {
	if dec.owners == nil {
		return owners.Record{}, errUnknownResponse(id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), OwnerTimeout)
	defer cancel()
	rec, err := dec.owners.Get(ctx, id)
	switch {
	case errors.Is(err, owners.ErrNotFound), err == nil && rec.Tenant != tenant:
		return owners.Record{}, errUnknownResponse(id)
	case err != nil:
		e := subjects.NewError(503, subjects.CodeRouterUnavailable, "the stored-response owners could not be read: "+err.Error())
		e.RetryAfter = time.Second
		return owners.Record{}, e
	}
	return rec, nil
}

// pin makes a request that continues a stored response go to the replica
// holding it, rec, and counts the stored conversation in its prompt: the
// engine puts it before the new input.
func (dec *Decider) pin(s *Scratch, h nats.Header, rec owners.Record) {
	q := &s.req
	q.Pin = rec.Replica
	q.PromptTokens += max(rec.Tokens, 0)
	s.setHeader(h, subjects.HdrPromptTokens, strconv.Itoa(q.PromptTokens))
}

// stored is the Action for a GET or DELETE of a stored response: read its
// owner first (storedAt goes on), or refuse it.
func (dec *Decider) stored(tenant string, h nats.Header) Action {
	fail := func(e *subjects.APIError) Action {
		dec.metrics.rejected(e.Code)
		return refuse(e)
	}
	if err := subjects.ValidToken(tenant); err != nil {
		return fail(subjects.NewError(400, subjects.CodeInvalidRequest, "tenant: "+err.Error()))
	}
	switch m := h.Get(subjects.HdrMethod); m {
	case http.MethodGet, http.MethodDelete:
	default:
		return fail(subjects.NewError(400, subjects.CodeInvalidRequest, subjects.HdrMethod+" must be GET or DELETE"))
	}
	return dec.readOwnerFirst(h.Get(subjects.HdrPreviousResponse))
}

// storedAt forwards a GET or DELETE of stored response id to the replica
// holding it, rec, or answers 404 when that replica cannot serve.
func (dec *Decider) storedAt(s *Scratch, tenant, reply string, h nats.Header, id string, rec owners.Record) Action {
	reg, ok := dec.router.Live(rec.Replica, dec.cfg.Now())
	if !ok {
		e := errOwnerGone(id, rec.Replica)
		dec.metrics.rejected(e.Code)
		return refuse(e)
	}
	s.setHeader(h, subjects.HdrEndpoint, subjects.EndpointResponses+"/"+id)
	s.setHeader(h, subjects.HdrRouteModel, reg.Model)
	s.setHeader(h, subjects.HdrRouteVersion, reg.Version)
	s.setHeader(h, subjects.HdrRoutePool, reg.Pool)
	s.setHeader(h, subjects.HdrRouteReplica, rec.Replica)
	s.setHeader(h, subjects.HdrRouteReason, policy.ReasonResponse)
	delete(h, subjects.HdrRoutePrefill)
	s.setHeader(h, subjects.HdrTenant, tenant)
	s.setHeader(h, subjects.HdrBroker, dec.cfg.ID)
	return dec.forwardTo(s, Route{Replica: rec.Replica, Pool: reg.Pool, Reason: policy.ReasonResponse}, reply, h, nil)
}

func errUnknownResponse(id string) *subjects.APIError {
	e := subjects.NewError(404, subjects.CodePreviousResponseNotFound, "Response with id '"+id+"' not found.")
	e.Param = "previous_response_id"
	return e
}

func errOwnerGone(id, replica string) *subjects.APIError {
	e := subjects.NewError(404, subjects.CodePreviousResponseNotFound,
		"Response with id '"+id+"' not found: replica "+replica+" that stored it is gone or draining.")
	e.Param = "previous_response_id"
	return e
}
