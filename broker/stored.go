package broker

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

// ownerTimeout bounds the owners-bucket read of one request.
const ownerTimeout = 2 * time.Second

// owner reads which replica holds stored response id for tenant. Another
// tenant's response is as unknown as a missing one. On the endpoint's
// goroutine (s.inline) it reads nothing: it sets s.deferred and returns
// no error, and the caller stops for routeDeferred.
func (b *Broker) owner(s *scratch, tenant, id string) (owners.Record, *subjects.APIError) {
	if !features.ValidResponseID(id) {
		return owners.Record{}, subjects.NewError(400, subjects.CodeInvalidRequest, subjects.HdrPreviousResponse+" must be a response id")
	}
	if b.owners == nil {
		return owners.Record{}, errUnknownResponse(id)
	}
	if s.inline {
		s.deferred = true
		return owners.Record{}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), ownerTimeout)
	defer cancel()
	rec, err := b.owners.Get(ctx, id)
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
// holding it, and counts the stored conversation in its prompt: the engine
// puts it before the new input.
func (b *Broker) pin(s *scratch, tenant string, h nats.Header) *subjects.APIError {
	q := &s.req
	id := h.Get(subjects.HdrPreviousResponse)
	if id == "" {
		return nil
	}
	rec, e := b.owner(s, tenant, id)
	if e != nil || s.deferred {
		return e
	}
	q.Pin = rec.Replica
	q.PromptTokens += max(rec.Tokens, 0)
	s.setHeader(h, subjects.HdrPromptTokens, strconv.Itoa(q.PromptTokens))
	return nil
}

// handleStored forwards a GET or DELETE of a stored response to the replica
// holding it, or answers 404 when it is unknown or its replica cannot
// serve.
func (b *Broker) handleStored(s *scratch, tenant, reply string, h nats.Header, msg *nats.Msg) (forward bool) {
	fail := func(e *subjects.APIError) {
		b.reject(msg, reply, e)
		b.metrics.rejected(e.Code)
	}
	if err := subjects.ValidToken(tenant); err != nil {
		fail(subjects.NewError(400, subjects.CodeInvalidRequest, "tenant: "+err.Error()))
		return false
	}
	switch m := h.Get(subjects.HdrMethod); m {
	case http.MethodGet, http.MethodDelete:
	default:
		fail(subjects.NewError(400, subjects.CodeInvalidRequest, subjects.HdrMethod+" must be GET or DELETE"))
		return false
	}
	id := h.Get(subjects.HdrPreviousResponse)
	rec, e := b.owner(s, tenant, id)
	if s.deferred {
		return false
	}
	if e != nil {
		fail(e)
		return false
	}
	reg, ok := b.router.Live(rec.Replica, b.cfg.Now())
	if !ok {
		fail(errOwnerGone(id, rec.Replica))
		return false
	}
	s.setHeader(h, subjects.HdrEndpoint, subjects.EndpointResponses+"/"+id)
	s.setHeader(h, subjects.HdrRouteModel, reg.Model)
	s.setHeader(h, subjects.HdrRouteVersion, reg.Version)
	s.setHeader(h, subjects.HdrRoutePool, reg.Pool)
	s.setHeader(h, subjects.HdrRouteReplica, rec.Replica)
	s.setHeader(h, subjects.HdrRouteReason, policy.ReasonResponse)
	s.setHeader(h, subjects.HdrTenant, tenant)
	s.setHeader(h, subjects.HdrBroker, b.cfg.ID)
	b.forwardTo(s, msg, rec.Replica, reply, h, nil)
	return true
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
