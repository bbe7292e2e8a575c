package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/internal/chunk"
	"github.com/switchyard-llm/switchyard/internal/jsonscan"
	"github.com/switchyard-llm/switchyard/internal/sse"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// MaxCarried bounds the text a continuation carries to the next replica:
// an answer longer than this when its replica fails is not resumed (the
// stream ends with its explicit error), so a continuation body stays small
// next to the request's own.
const MaxCarried = 256 << 10

// maxResumes is how many times one request is continued on another
// replica (judge's budgets).
const maxResumes = 1

// carry follows a streamed answer so it can continue on another replica:
// the text and completion tokens relayed so far, and the identity (id,
// created, model) every chunk of the client's one stream keeps. It also
// rewrites the continuation's chunks into that stream: its role chunk
// dropped, its identity replaced and its usage summed.
type carry struct {
	on  bool   // the answer can still be continued
	why string // why not, once !on

	chat      bool
	maxTokens int // the request's max tokens; 0: unset

	text    []byte
	tokens  int // completion tokens of the parts before this one
	part    int // completion tokens of this part
	parts   int // continuations issued
	from    string
	roleOut bool // a role chunk reached the client

	id, model []byte // string literals as the first part's chunks have them
	created   []byte
	known     bool // id, created and model are recorded
	finished  bool // a finish_reason was relayed
}

// stop marks the answer as one that cannot continue.
func (c *carry) stop(why string) {
	if c.on {
		c.on, c.why = false, why
	}
}

// event reads one whole event of the stream and returns what the client
// gets of it: the event itself, a rewrite of it, or nil to drop it.
// failed is set for an in-band error event from the engine, which ends
// this part as a failure the relay may resume from.
func (c *carry) event(ev []byte) (out []byte, failed bool) {
	if !c.on && c.parts == 0 {
		return ev, false // not followed: nothing to carry or rewrite
	}
	data := sse.Data(ev)
	if len(data) == 0 || bytes.Equal(data, []byte("[DONE]")) {
		return ev, false
	}
	v, ok := chunk.Read(data)
	if !ok {
		c.stop("a chunk is not an OpenAI chunk")
		return ev, false
	}
	if v.Error {
		return ev, c.on
	}
	cont := c.parts > 0 && c.known
	if !c.known && len(v.ID) > 2 {
		c.id, c.created, c.model, c.known = bytes.Clone(v.ID), bytes.Clone(v.Created), bytes.Clone(v.Model), true
	}
	switch {
	case v.OtherChoices:
		c.stop("n > 1")
	case v.Logprobs:
		c.stop("logprobs")
	case v.ToolCalls:
		c.stop("a tool call is in progress")
	case v.Reasoning:
		c.stop("reasoning is in progress")
	}
	c.add(v.Text)
	if v.Finish {
		c.finished = true
	}
	if v.HasUsage && v.Usage.CompletionTokens > 0 && c.parts == 0 {
		c.part = v.Usage.CompletionTokens // the engine's count, when it gave one
	}
	if v.Role && len(v.Text) == 0 && !v.Finish { // a role chunk
		if c.roleOut {
			return nil, false // the continuation's: the client has one
		}
		c.roleOut = true
	}
	if !cont || (bytes.Equal(v.ID, c.id) && bytes.Equal(v.Model, c.model) && bytes.Equal(v.Created, c.created) && !v.HasUsage) {
		return ev, false
	}
	return c.rewrite(data, v.HasUsage), false
}

// add counts a content delta and carries its text.
func (c *carry) add(s []byte) {
	if len(s) == 0 {
		return
	}
	c.part++
	if !c.on {
		return
	}
	if len(c.text)+len(s) > MaxCarried {
		c.stop("the text so far is over the carried limit")
		return
	}
	c.text = append(c.text, s...)
}

// rewrite gives a continuation's chunk the stream's identity and, on the
// usage chunk, the whole answer's usage: the prompt counted once (the
// continuation's engine read the carried text as prompt) and the
// completion tokens of every part. Like the adapter's body rewrite it
// splices: the values of "id", "model", "created" and the usage counts are
// replaced where they stand (every occurrence, since a decoder keeps the
// last) or added at the end, and the rest of the chunk is its own bytes.
func (c *carry) rewrite(data []byte, usage bool) []byte {
	if !jsonscan.Valid(data) {
		return sseEvent("", data)
	}
	set := []chunk.Member{{Key: "id", Value: c.id}, {Key: "model", Value: c.model}}
	if len(c.model) == 0 {
		set[1].Value = []byte(`""`) // the first part's chunks named none
	}
	if len(c.created) > 0 {
		set = append(set, chunk.Member{Key: "created", Value: c.created})
	}
	if usage {
		set = append(set, chunk.Member{Key: "usage", Edit: c.sumUsage})
	}
	out, ok := chunk.Splice(make([]byte, 0, len(data)+len(c.id)+len(c.model)+32), data, set)
	if !ok {
		return sseEvent("", data)
	}
	return sseEvent("", out)
}

// sumUsage is a continuation's usage object with the carried completion
// tokens moved from its prompt to its completion; a usage that is not an
// object stays as it is.
func (c *carry) sumUsage(dst, u []byte) []byte {
	if len(u) == 0 || u[0] != '{' {
		return append(dst, u...)
	}
	n, _ := chunk.ReadUsage(u)
	prompt, completion := n.PromptTokens, n.CompletionTokens
	prompt = max(prompt-c.tokens, 0)
	completion += c.tokens
	out, ok := chunk.Splice(dst, u, []chunk.Member{
		{Key: "prompt_tokens", Value: strconv.AppendInt(nil, int64(prompt), 10)},
		{Key: "completion_tokens", Value: strconv.AppendInt(nil, int64(completion), 10)},
		{Key: "total_tokens", Value: strconv.AppendInt(nil, int64(prompt+completion), 10)},
	})
	if !ok {
		return append(dst, u...)
	}
	return out
}

// resumeRequest is what decides whether a request can continue elsewhere.
type resumeRequest struct {
	N, BestOf                      *int
	Logprobs, TopLogprobs, Prompt  json.RawMessage // the body's own bytes
	Echo                           bool
	MaxTokens, MaxCompletionTokens *int
}

// readResumeRequest reads the members of the body that decide a
// continuation, as encoding/json would decode them into resumeRequest: keys
// matched under its case folding, the last of duplicates kept, a value of
// the wrong type an error. The feature extraction validated the body, so
// its members are walked at memory speed and only the few wanted values
// decoded: a long conversation is not decoded a second time.
func readResumeRequest(body []byte) (r resumeRequest, err error) {
	start := jsonscan.SkipSpace(body, 0)
	if bytes.Equal(bytes.TrimSpace(body[start:]), []byte("null")) {
		return r, nil // decodes as nothing, as encoding/json has it
	}
	m := jsonscan.NewMembers(body, start)
	for m.Next() {
		k, v := m.Key(), m.Value()
		switch {
		case k.EqualFold("n"):
			err = json.Unmarshal(v, &r.N)
		case k.EqualFold("best_of"):
			err = json.Unmarshal(v, &r.BestOf)
		case k.EqualFold("logprobs"):
			r.Logprobs = v
		case k.EqualFold("top_logprobs"):
			r.TopLogprobs = v
		case k.EqualFold("echo"):
			err = json.Unmarshal(v, &r.Echo)
		case k.EqualFold("prompt"):
			r.Prompt = v
		case k.EqualFold("max_tokens"):
			err = json.Unmarshal(v, &r.MaxTokens)
		case k.EqualFold("max_completion_tokens"):
			err = json.Unmarshal(v, &r.MaxCompletionTokens)
		}
		if err != nil {
			return r, err
		}
	}
	if end := m.End(); end < 0 || jsonscan.SkipSpace(body, end) != len(body) {
		return r, errors.New("the body is not a JSON object")
	}
	return r, nil
}

// newCarry decides once, from the request, whether its answer can be
// continued on another replica, and starts following it.
func newCarry(u *upstream, t *table.Snapshot, routedModel string) *carry {
	c := &carry{chat: u.endpoint == subjects.EndpointChat}
	if u.endpoint != subjects.EndpointChat && u.endpoint != subjects.EndpointCompletions {
		c.why = "only chat and text completions continue"
		return c
	}
	if t != nil {
		name := routedModel
		if name == "" {
			name = u.model
		}
		if t.Models[name].ResumeMethod() == table.ResumeNone {
			c.why = "the model's resume method is none"
			return c
		}
	}
	r, err := readResumeRequest(u.body)
	if err != nil {
		c.why = "the body is not a JSON object"
		return c
	}
	switch {
	case r.N != nil && *r.N > 1, r.BestOf != nil && *r.BestOf > 1:
		c.why = "n > 1"
	case set(r.Logprobs) || set(r.TopLogprobs):
		c.why = "logprobs"
	case r.Echo:
		c.why = "echo"
	case !c.chat && (len(r.Prompt) == 0 || r.Prompt[0] != '"'):
		c.why = "the prompt is not one string"
	default:
		c.on = true
	}
	if r.MaxCompletionTokens != nil {
		c.maxTokens = *r.MaxCompletionTokens
	} else if r.MaxTokens != nil {
		c.maxTokens = *r.MaxTokens
	}
	return c
}

// set reports whether a JSON value is present and not null or false.
func set(v json.RawMessage) bool {
	s := string(bytes.TrimSpace(v))
	return s != "" && s != "null" && s != "false"
}

// continuation builds the request that continues the answer: chat gets
// the text so far as a final assistant message to continue, completions
// the prompt followed by it, and the max tokens less what was generated.
// ok is false, with why, when it cannot be built.
func (c *carry) continuation(body []byte) (b []byte, why string) {
	generated := c.tokens + c.part
	if len(c.text) == 0 {
		return body, "" // nothing carried: the request itself, re-run
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, "the body is not a JSON object"
	}
	if c.maxTokens > 0 {
		left := c.maxTokens - generated
		if left < 1 {
			return nil, "the max tokens are spent"
		}
		for _, k := range [...]string{"max_tokens", "max_completion_tokens"} {
			if _, ok := m[k]; ok {
				m[k] = json.RawMessage(strconv.Itoa(left))
			}
		}
	}
	text, _ := json.Marshal(string(c.text))
	if c.chat {
		var msgs []json.RawMessage
		if err := json.Unmarshal(m["messages"], &msgs); err != nil {
			return nil, "messages is not an array"
		}
		msgs = append(msgs, json.RawMessage(`{"role":"assistant","content":`+string(text)+`}`))
		m["messages"], _ = json.Marshal(msgs)
		m["continue_final_message"] = json.RawMessage("true")
		m["add_generation_prompt"] = json.RawMessage("false")
	} else {
		var p string
		if err := json.Unmarshal(m["prompt"], &p); err != nil {
			return nil, "the prompt is not one string"
		}
		m["prompt"], _ = json.Marshal(p + string(c.text))
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err.Error()
	}
	return b, ""
}

// next starts a new part: what this one generated is carried.
func (c *carry) next(from string) {
	c.tokens += c.part
	c.part = 0
	c.parts++
	c.from = from
}

// continuation is the body that continues the answer r failed in, or nil,
// with the reason logged, when it cannot continue: the request does not
// allow it, the answer so far cannot be carried or was whole, or the
// continuation is over the body limit; nil without a word when the
// request already used its resumes (judge would not take it). Nothing is
// committed until the relay resumes (resume).
func (s *response) continuation(r result) []byte {
	c := s.following()
	if !c.on || c.finished || c.parts >= maxResumes {
		return nil
	}
	b, why := c.continuation(s.u.body)
	if why == "" && int64(len(b)) > s.g.maxBody {
		why = "the continuation is over the body limit"
	}
	if why != "" {
		c.stop(why)
		s.g.log.Info("cannot resume", "from", r.replica, "why", why)
		return nil
	}
	return b
}

// resume makes r's continuation the body of the attempts to come.
func (s *response) resume(r result) {
	s.carry.next(r.replica)
	s.cont, s.failed = r.cont, r.err
}

// continueRequest marks an attempt as a continuation: the replica it
// resumes from, the tokens carried (counted in the prompt), and the max
// tokens left.
func (s *response) continueRequest(q *policy.Request) {
	c := s.carry
	q.ResumeFrom, q.ResumeTokens = c.from, c.tokens
	if c.maxTokens > 0 {
		q.MaxTokens = max(c.maxTokens-c.tokens, 1)
	}
	q.PromptTokens += c.tokens
}
