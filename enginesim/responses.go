package enginesim

import (
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
)

// The Responses API as vLLM serves it with VLLM_ENABLE_RESPONSES_API_STORE=1:
// every response is stored in this replica's memory, so a turn naming
// previous_response_id works only on the replica that answered the turn
// before. vLLM never evicts; the simulator keeps the newest maxStored.

const maxStored = 10000

type responseStore struct {
	mu    sync.Mutex
	byID  map[string]*storedResponse
	order list.List // of ids, oldest first
	limit int
}

type storedResponse struct {
	context string // the whole conversation so far: prompt and answer
	body    []byte // the response object, as GET returns it
	elem    *list.Element
}

func (rs *responseStore) get(id string) (*storedResponse, bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r, ok := rs.byID[id]
	return r, ok
}

func (rs *responseStore) put(id string, r *storedResponse) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r.elem = rs.order.PushBack(id)
	rs.byID[id] = r
	for rs.order.Len() > rs.limit {
		old := rs.order.Remove(rs.order.Front()).(string)
		delete(rs.byID, old)
	}
}

func (rs *responseStore) remove(id string) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r, ok := rs.byID[id]
	if ok {
		rs.order.Remove(r.elem)
		delete(rs.byID, id)
	}
	return ok
}

type responsesRequest struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       string          `json:"instructions"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Stream             bool            `json:"stream"`
	Store              *bool           `json:"store"`
	PreviousResponseID string          `json:"previous_response_id"`
	Priority           int64           `json:"priority"`
}

// responsesInput renders input: a string, or items whose content is a
// string or parts with text (input_text, output_text).
func responsesInput(raw json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return "<|user|>" + s + "\n", nil
	}
	var items []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &items); err != nil {
		return "", errors.New("input must be a string or an array of items")
	}
	var b strings.Builder
	for _, it := range items {
		text, err := contentText(it.Content, "")
		if err != nil {
			return "", err
		}
		b.WriteString("<|" + it.Role + "|>" + text + "\n")
	}
	return b.String(), nil
}

// responseObject is OpenAI's response object.
type responseObject struct {
	ID                 string          `json:"id"`
	Object             string          `json:"object"`
	CreatedAt          int64           `json:"created_at"`
	Status             string          `json:"status"`
	Error              any             `json:"error"`
	IncompleteDetails  any             `json:"incomplete_details"`
	Instructions       *string         `json:"instructions"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Model              string          `json:"model"`
	Output             []responseItem  `json:"output"`
	ParallelToolCalls  bool            `json:"parallel_tool_calls"`
	PreviousResponseID *string         `json:"previous_response_id"`
	Store              bool            `json:"store"`
	Temperature        float64         `json:"temperature"`
	ToolChoice         string          `json:"tool_choice"`
	Tools              []any           `json:"tools"`
	TopP               float64         `json:"top_p"`
	Truncation         string          `json:"truncation"`
	Usage              *responsesUsage `json:"usage"`
	Metadata           map[string]any  `json:"metadata"`
}

type responseItem struct {
	Type    string       `json:"type"`
	ID      string       `json:"id"`
	Status  string       `json:"status"`
	Role    string       `json:"role"`
	Content []outputPart `json:"content"`
}

type outputPart struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
}

type responsesUsage struct {
	InputTokens         int            `json:"input_tokens"`
	InputTokensDetails  map[string]int `json:"input_tokens_details"`
	OutputTokens        int            `json:"output_tokens"`
	OutputTokensDetails map[string]int `json:"output_tokens_details"`
	TotalTokens         int            `json:"total_tokens"`
}

func (s *Server) handleResponses(w http.ResponseWriter, r *http.Request) {
	var req responsesRequest
	if err := decode(r, w, &req); err != nil {
		writeError(w, err)
		return
	}
	var history string
	if req.PreviousResponseID != "" {
		prev, ok := s.stored.get(req.PreviousResponseID)
		if !ok {
			writeError(w, errorf(http.StatusNotFound, "Response with id '%s' not found.", req.PreviousResponseID))
			return
		}
		history = prev.context
	}
	g, err := s.newGeneration(w, false, req.Model, req.MaxOutputTokens, req.Stream, nil, s.promptInput(func() (prompt, error) {
		if len(req.Input) == 0 {
			return prompt{}, errorf(http.StatusBadRequest, "input is required")
		}
		in, err := responsesInput(req.Input)
		if err != nil {
			return prompt{}, errorf(http.StatusBadRequest, "%v", err)
		}
		text := history
		if req.Instructions != "" {
			text += "<|system|>" + req.Instructions + "\n"
		}
		return textPrompt(text + in), nil
	}))
	if err == nil {
		err = s.prioritize(g, req.Priority)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	g.id = "resp_" + strings.ReplaceAll(w.Header().Get("X-Request-Id"), "-", "")
	store := req.Store == nil || *req.Store
	obj := responseObject{
		ID: g.id, Object: "response", CreatedAt: g.created, Status: "in_progress", Model: g.model,
		MaxOutputTokens: req.MaxOutputTokens, Output: []responseItem{}, ParallelToolCalls: true,
		Store: store, Temperature: 1, ToolChoice: "auto", Tools: []any{}, TopP: 1, Truncation: "disabled",
		Metadata: map[string]any{},
	}
	if req.Instructions != "" {
		obj.Instructions = &req.Instructions
	}
	if req.PreviousResponseID != "" {
		obj.PreviousResponseID = &req.PreviousResponseID
	}
	a := &answer{s: s, w: w, r: r, g: g}
	a.finish = func(p progress) []byte {
		text := s.words.answer(g.seed, 0, p.tokens)
		obj.Status = "completed"
		if g.reason == "length" {
			obj.Status = "incomplete"
			obj.IncompleteDetails = map[string]string{"reason": "max_output_tokens"}
		}
		obj.Output = []responseItem{{Type: "message", ID: "msg_" + g.id[5:], Status: "completed", Role: "assistant",
			Content: []outputPart{{Type: "output_text", Text: text, Annotations: []any{}}}}}
		obj.Usage = &responsesUsage{InputTokens: g.prompt.tokens, OutputTokens: p.tokens, TotalTokens: g.prompt.tokens + p.tokens,
			InputTokensDetails: map[string]int{"cached_tokens": p.cached}, OutputTokensDetails: map[string]int{"reasoning_tokens": 0}}
		b, _ := json.Marshal(obj)
		if store {
			s.stored.put(g.id, &storedResponse{context: g.prompt.text + "<|assistant|>" + text + "\n", body: b})
		}
		return b
	}
	if !req.Stream {
		a.whole()
		return
	}
	item := responseItem{Type: "message", ID: "msg_" + g.id[5:], Status: "in_progress", Role: "assistant", Content: []outputPart{}}
	part := outputPart{Type: "output_text", Annotations: []any{}}
	var text strings.Builder
	seq := 0
	ev := func(typ string, fields map[string]any) []byte {
		fields["type"], fields["sequence_number"] = typ, seq
		seq++
		b, _ := json.Marshal(fields)
		return sseBytes(typ, b)
	}
	a.stream(func() []byte {
		created := ev("response.created", map[string]any{"response": obj})
		return append(append(created, ev("response.in_progress", map[string]any{"response": obj})...),
			append(ev("response.output_item.added", map[string]any{"output_index": 0, "item": item}),
				ev("response.content_part.added", map[string]any{"item_id": item.ID, "output_index": 0, "content_index": 0, "part": part})...)...)
	}, func(word string) []byte {
		text.WriteString(word)
		return ev("response.output_text.delta", map[string]any{"item_id": item.ID, "output_index": 0, "content_index": 0, "delta": word, "logprobs": []any{}})
	}, func(p progress) []byte {
		part.Text = text.String()
		b := a.finish(p)
		var done responseObject
		_ = json.Unmarshal(b, &done)
		out := ev("response.output_text.done", map[string]any{"item_id": item.ID, "output_index": 0, "content_index": 0, "text": part.Text, "logprobs": []any{}})
		out = append(out, ev("response.content_part.done", map[string]any{"item_id": item.ID, "output_index": 0, "content_index": 0, "part": part})...)
		out = append(out, ev("response.output_item.done", map[string]any{"output_index": 0, "item": done.Output[0]})...)
		return append(out, ev("response.completed", map[string]any{"response": done})...)
	}, func(err error) []byte {
		b, _ := json.Marshal(map[string]any{"type": "error", "code": "server_error", "message": err.Error(), "param": nil, "sequence_number": seq})
		return sseBytes("error", b)
	})
}

func (s *Server) handleGetResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if st, ok := s.stored.get(id); ok {
		writeJSONBytes(w, http.StatusOK, st.body)
		return
	}
	writeError(w, errorf(http.StatusNotFound, "Response with id '%s' not found.", id))
}

func (s *Server) handleDeleteResponse(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !s.stored.remove(id) {
		writeError(w, errorf(http.StatusNotFound, "Response with id '%s' not found.", id))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": "response", "deleted": true})
}

func sseBytes(event string, data []byte) []byte {
	out := make([]byte, 0, len(event)+len(data)+16)
	out = append(out, "event: "...)
	out = append(out, event...)
	out = append(out, "\ndata: "...)
	out = append(out, data...)
	return append(out, '\n', '\n')
}

// answer runs a generation for the Responses and Messages APIs, whose
// events differ from chat's but whose generation does not.
type answer struct {
	s      *Server
	w      http.ResponseWriter
	r      *http.Request
	g      *generation
	finish func(p progress) []byte // the whole answer's body
	// writeErr answers an error before the head (nil: OpenAI's shape).
	writeErr func(w http.ResponseWriter, err error)
}

func (a *answer) fail(err error) {
	if a.writeErr != nil {
		a.writeErr(a.w, err)
		return
	}
	writeError(a.w, err)
}

// whole waits for the generation and writes the answer at once.
// open starts the generation; a failure is answered here (unless the client
// is gone) and nil returned.
func (a *answer) open(ctx context.Context) source {
	src, err := a.s.open(ctx, a.g)
	if err != nil {
		if ctx.Err() == nil {
			a.fail(apiError(err))
		}
		return nil
	}
	return src
}

func (a *answer) whole() {
	ctx := a.r.Context()
	src := a.open(ctx)
	if src == nil {
		return
	}
	defer src.close()
	var p progress
	for !p.done {
		var err error
		if p, err = src.next(ctx, p.tokens); err != nil {
			if ctx.Err() == nil {
				a.fail(apiError(err))
			}
			return
		}
	}
	b := a.finish(p)
	writeJSONBytes(a.w, http.StatusOK, b)
}

// stream writes start at once, one delta per token, then end; a failure
// after the head is reported with fail's event.
func (a *answer) stream(start func() []byte, delta func(word string) []byte, end func(p progress) []byte, fail func(err error) []byte) {
	ctx := a.r.Context()
	src := a.open(ctx)
	if src == nil {
		return
	}
	defer src.close()
	rc := http.NewResponseController(a.w)
	h := a.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	a.w.WriteHeader(http.StatusOK)
	if _, err := a.w.Write(start()); err != nil {
		return
	}
	_ = rc.Flush()
	seen := 0
	for {
		p, err := src.next(ctx, seen)
		if err != nil {
			if ctx.Err() == nil {
				_, _ = a.w.Write(fail(apiError(err)))
				_ = rc.Flush()
			}
			return
		}
		for i := seen; i < p.tokens; i++ {
			if _, err := a.w.Write(delta(a.s.words.word(a.g.seed, i))); err != nil {
				return
			}
		}
		seen = p.tokens
		if p.done {
			_, _ = a.w.Write(end(p))
			_ = rc.Flush()
			return
		}
		if rc.Flush() != nil {
			return
		}
	}
}
