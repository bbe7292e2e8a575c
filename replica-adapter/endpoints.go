package adapter

import (
	"context"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/features"
	"github.com/switchyard-llm/switchyard/owners"
	"github.com/switchyard-llm/switchyard/subjects"
)

// forwardable is the one list of engine calls the adapter makes on a
// request's behalf: POST to an inference endpoint, and GET or DELETE of a
// stored response. Nothing else reaches the engine.
func forwardable(method, endpoint string) bool {
	switch method {
	case "", http.MethodPost:
		return subjects.EndpointBit(endpoint) != 0
	case http.MethodGet, http.MethodDelete:
		id, ok := strings.CutPrefix(endpoint, subjects.EndpointResponses+"/")
		return ok && features.ValidResponseID(id)
	}
	return false
}

// servedBy is what each engine flavor serves: vLLM all of it (the
// Responses store with VLLM_ENABLE_RESPONSES_API_STORE=1), llama.cpp's
// server the Messages API but not Responses, SGLang and TGI the OpenAI
// basics. An unknown flavor (auto, not yet detected) claims the base set.
func servedBy(flavor string) []string {
	switch flavor {
	case FlavorVLLM:
		return subjects.AllEndpoints()
	case FlavorLlamaCpp:
		return []string{subjects.EndpointChat, subjects.EndpointCompletions, subjects.EndpointEmbeddings, subjects.EndpointMessages}
	case FlavorTGI:
		return []string{subjects.EndpointChat, subjects.EndpointCompletions}
	}
	return subjects.BaseEndpoints()
}

// endpoints is what this replica tells brokers it serves (heartbeat and
// replicas.<id>): Config.Endpoints when set, else its flavor's.
func (a *Adapter) endpoints() []string {
	if len(a.cfg.Endpoints) > 0 {
		return a.cfg.Endpoints
	}
	a.load.mu.Lock()
	flavor := a.load.flavor
	a.load.mu.Unlock()
	if flavor == "" {
		flavor = a.cfg.Flavor
	}
	return servedBy(flavor)
}

// serves reports whether the engine serves endpoint (a stored response's
// path counts as the Responses API).
func (a *Adapter) serves(endpoint string) bool {
	if strings.HasPrefix(endpoint, subjects.EndpointResponses+"/") {
		endpoint = subjects.EndpointResponses
	}
	return slices.Contains(a.endpoints(), endpoint)
}

func errNotServed(endpoint string) *subjects.APIError {
	return subjects.NewError(http.StatusNotImplemented, subjects.CodeEndpointNotSupported, "this replica's engine does not serve "+endpoint)
}

// responseID finds a Responses API answer's id: the first "id" of the body
// (a non-streamed response object) or of its first event
// (response.created, whose response comes first).
var responseIDPattern = regexp.MustCompile(`"id"\s*:\s*"([A-Za-z0-9_-]{1,128})"`)

// ownerRecorder remembers, in the owners bucket, that this replica holds
// the response it is relaying, before the client can name it in its next
// turn: the record is written when the id is first seen, ahead of the
// bytes that carry it.
type ownerRecorder struct {
	a      *Adapter
	h      nats.Header
	head   []byte // the body's start, until the id is found
	done   bool
	tokens int
}

// maxIDSearch is how far into the body the id is looked for.
const maxIDSearch = 16 << 10

func (a *Adapter) newOwnerRecorder(h nats.Header) *ownerRecorder {
	if a.owners == nil || h.Get(subjects.HdrEndpoint) != subjects.EndpointResponses || h.Get(subjects.HdrMethod) != "" {
		return nil
	}
	prompt, _ := strconv.Atoi(h.Get(subjects.HdrPromptTokens))
	maxTok, _ := strconv.Atoi(h.Get(subjects.HdrMaxTokens))
	return &ownerRecorder{a: a, h: h, tokens: max(prompt, 0) + max(maxTok, 0)}
}

// observe looks at the next bytes of the answer.
func (o *ownerRecorder) observe(ctx context.Context, b []byte) {
	if o == nil || o.done {
		return
	}
	o.head = append(o.head, b[:min(len(b), maxIDSearch-len(o.head))]...)
	m := responseIDPattern.FindSubmatch(o.head)
	if m == nil {
		if len(o.head) >= maxIDSearch {
			o.done = true
		}
		return
	}
	o.done = true
	id := string(m[1])
	rec := owners.Record{Tenant: o.h.Get(subjects.HdrTenant), Replica: o.a.cfg.Replica, Model: o.a.cfg.Model, Tokens: o.tokens}
	if err := o.a.owners.Put(ctx, id, rec); err != nil {
		o.a.log.Warn("stored response not remembered: a next turn naming it will not find it", "response", id, "err", err)
	}
	o.head = nil
}

// forgetDeleted drops a deleted response from the owners bucket.
func (a *Adapter) forgetDeleted(ctx context.Context, h nats.Header, status int) {
	if a.owners == nil || h.Get(subjects.HdrMethod) != http.MethodDelete || status != http.StatusOK {
		return
	}
	if id, ok := strings.CutPrefix(h.Get(subjects.HdrEndpoint), subjects.EndpointResponses+"/"); ok {
		_ = a.owners.Forget(ctx, id)
	}
}
