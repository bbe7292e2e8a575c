package decider

import (
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/features"
	"github.com/switchyard-llm/switchyard/subjects"
)

// scanBody fills what the headers do not give from the body (model, prompt
// tokens, max tokens, prefix, features): the one place the broker reads a
// body. Every direct client's request comes here (fillRequest removed the
// headers it may not set); the gateway always sets them, so its requests
// never do.
func (dec *Decider) scanBody(s *Scratch, h nats.Header) *subjects.APIError {
	fr := features.Request{Prompt: s.prompt} // rendered into the pooled buffer
	if err := features.ParseRequestInto(&fr, s.req.Endpoint, s.body); err != nil {
		if pe, ok := err.(*features.ParseError); ok {
			return pe.APIError()
		}
		return subjects.NewError(400, subjects.CodeInvalidRequest, err.Error())
	}
	q := &s.req
	if q.Model == "" {
		q.Model = fr.Model
		s.setHeader(h, subjects.HdrModel, fr.Model)
	}
	if q.Model == "" {
		return subjects.NewError(400, subjects.CodeInvalidRequest, "model is required")
	}
	if h.Get(subjects.HdrPromptTokens) == "" {
		q.PromptTokens = fr.PromptTokens
		s.setHeader(h, subjects.HdrPromptTokens, strconv.Itoa(fr.PromptTokens))
	}
	if q.MaxTokens == 0 && fr.MaxTokens != nil {
		q.MaxTokens = *fr.MaxTokens
	}
	if fr.PreviousResponseID != "" && h.Get(subjects.HdrPreviousResponse) == "" {
		s.setHeader(h, subjects.HdrPreviousResponse, fr.PreviousResponseID)
	}
	if fr.Stream && h.Get(subjects.HdrStream) == "" {
		s.setHeader(h, subjects.HdrStream, "1")
	}
	if q.Endpoint == "" {
		q.Endpoint = subjects.EndpointChat
		s.setHeader(h, subjects.HdrEndpoint, q.Endpoint)
	}
	s.prompt = fr.Prompt
	if len(q.Prefix) == 0 {
		if t := dec.router.Table(); t != nil {
			s.prefix = features.AppendPrefix(s.prefix[:0], s.prompt, t.Policy.PrefixBlockChars, t.Policy.PrefixMaxBlocks)
			q.Prefix = s.prefix
		}
	}
	if len(q.Features) == 0 {
		if f := features.Flags(s.prompt); f != "" {
			s.features = appendSplit(s.features[:0], f)
			q.Features = s.features
		}
	}
	return nil
}

// renderPrompt is policy.Request.Prompt: the canonical prompt, rendered from
// the body only when a regex cascade rule asks for it.
func (s *Scratch) renderPrompt() []byte {
	if len(s.prompt) > 0 || len(s.body) == 0 {
		return s.prompt
	}
	var fr features.Request
	fr.Prompt = s.prompt
	if features.ParseRequestInto(&fr, s.req.Endpoint, s.body) == nil {
		s.prompt = fr.Prompt
	}
	return s.prompt
}
