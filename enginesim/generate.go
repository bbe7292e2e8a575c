package enginesim

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"time"
)

// progress is how far a request has got.
type progress struct {
	tokens int // generated so far
	cached int // prompt tokens served by the prefix cache
	done   bool
}

// stream carries a request's progress from the owner goroutine to its
// handler. The owner never blocks on it: updates overwrite, and a one-slot
// channel wakes the handler, which reads the latest state.
type stream struct {
	reason string // finish reason once max tokens are generated

	mu     sync.Mutex
	p      progress
	err    error
	notify chan struct{}
}

func newStream(reason string) *stream {
	return &stream{reason: reason, notify: make(chan struct{}, 1)}
}

func (st *stream) update(tokens, cached int, done bool) {
	st.mu.Lock()
	st.p = progress{tokens: tokens, cached: cached, done: done}
	st.mu.Unlock()
	st.signal()
}

func (st *stream) fail(err error) {
	st.mu.Lock()
	st.err = err
	st.mu.Unlock()
	st.signal()
}

func (st *stream) signal() {
	select {
	case st.notify <- struct{}{}:
	default:
	}
}

func (st *stream) load() (progress, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.p, st.err
}

// source is where a handler gets a request's tokens from: the engine, or
// the fixed-latency clock.
type source interface {
	// next blocks until more than seen tokens exist or the request is done.
	next(ctx context.Context, seen int) (progress, error)
	// close releases the request, cancelling it when it has not finished.
	close()
}

type engineSource struct {
	s  *Server
	id ID
	st *stream
}

func (src *engineSource) next(ctx context.Context, seen int) (progress, error) {
	for {
		p, err := src.st.load()
		if err != nil {
			return p, err
		}
		if p.tokens > seen || p.done {
			return p, nil
		}
		select {
		case <-src.st.notify:
		case <-ctx.Done():
			return p, ctx.Err()
		case <-src.s.stopped:
			if p, err := src.st.load(); err != nil || p.tokens > seen || p.done {
				return p, err
			}
			return p, errStopped
		}
	}
}

func (src *engineSource) close() {
	if p, err := src.st.load(); err == nil && !p.done {
		src.s.cancel(src.id)
	}
}

// generation is one completion request, parsed and validated.
type generation struct {
	chat         bool
	id           string
	model        string // as the client named it, echoed back
	created      int64
	prompt       prompt
	req          Request
	reason       string
	seed         uint64
	from         int // the answer's first token: past the words a continuation carries
	stream       bool
	includeUsage bool
	// remoteDecode: a prefill leg (do_remote_decode), whose answer holds
	// its blocks and carries the kv_transfer_params of its decode leg.
	remoteDecode bool
	// returnTokenIDs: the answer carries the prompt's token ids and its
	// own (return_token_ids).
	returnTokenIDs bool
}

// open starts the request in the engine (or the fixed clock).
func (s *Server) open(ctx context.Context, g *generation) (source, error) {
	if s.cfg.Fixed {
		return s.openFixed(g), nil
	}
	st := newStream(g.reason)
	id, err := s.submit(ctx, g.req, st)
	if err != nil {
		return nil, err
	}
	return &engineSource{s: s, id: id, st: st}, nil
}

// apiError maps engine and shell errors to vLLM's error responses.
func apiError(err error) error {
	switch {
	case errors.Is(err, ErrQueueFull):
		e := errorf(http.StatusServiceUnavailable, "The engine is at capacity: %v", err)
		e.retryAfter = 1
		return e
	case errors.Is(err, ErrTooLarge), errors.Is(err, ErrInvalid), errors.Is(err, ErrLoraDisabled), errors.Is(err, ErrPriorityDisabled):
		return errorf(http.StatusBadRequest, "%v", err)
	case errors.Is(err, errStopped):
		return errorf(http.StatusServiceUnavailable, "The engine is shutting down")
	}
	return err
}

func (s *Server) generate(w http.ResponseWriter, r *http.Request, g *generation) {
	ctx := r.Context()
	src, err := s.open(ctx, g)
	if err != nil {
		if ctx.Err() == nil {
			writeError(w, apiError(err))
		}
		return
	}
	defer src.close()
	if g.stream {
		s.streamSSE(w, r, g, src)
		return
	}
	var p progress
	for !p.done {
		if p, err = src.next(ctx, p.tokens); err != nil {
			if ctx.Err() == nil {
				writeError(w, apiError(err))
			}
			return
		}
	}
	var kv *KVTransferParams
	if g.remoteDecode {
		kv = s.heldParams(r, g)
	}
	writeJSON(w, http.StatusOK, s.response(g, p, kv))
}

func (s *Server) response(g *generation, p progress, kv *KVTransferParams) any {
	u := g.usage(p)
	reason := g.reason
	text := s.words.answer(g.seed, g.from, g.from+p.tokens)
	var promptIDs, ids []uint32
	if g.returnTokenIDs {
		promptIDs = g.prompt.tokenIDs()
		ids = s.words.ids(make([]uint32, 0, p.tokens), g.seed, g.from, g.from+p.tokens)
	}
	if g.chat {
		return chatCompletion{ID: g.id, Model: g.model, Object: "chat.completion", Created: g.created, Usage: u,
			Choices:          []chatChoice{{FinishReason: &reason, Message: &chatMessageOut{Role: "assistant", Content: text}, TokenIDs: ids}},
			KVTransferParams: kv, PromptTokenIDs: promptIDs}
	}
	return textCompletion{ID: g.id, Model: g.model, Object: "text_completion", Created: g.created, Usage: u,
		Choices: []textChoice{{Text: text, FinishReason: &reason, PromptTokenIDs: promptIDs, TokenIDs: ids}}, KVTransferParams: kv}
}

func (g *generation) usage(p progress) *usage {
	return &usage{
		PromptTokens: g.prompt.tokens, CompletionTokens: p.tokens, TotalTokens: g.prompt.tokens + p.tokens,
		PromptTokensDetails: &promptDetails{CachedTokens: p.cached},
	}
}

// chunk is one SSE event of a streamed completion.
type chunk struct {
	ID      string          `json:"id"`
	Model   string          `json:"model"`
	Object  string          `json:"object"`
	Created int64           `json:"created"`
	Usage   json.RawMessage `json:"usage,omitempty"`
	Choices any             `json:"choices"`
	// PromptTokenIDs: a chat stream's first chunk answers
	// return_token_ids with the prompt's token ids.
	PromptTokenIDs []uint32 `json:"prompt_token_ids,omitempty"`
}

// streamSSE writes the answer as server-sent events, one per token, flushed
// as the engine produces them. Headers go out at once; the role chunk comes
// with the first token, so the first content byte marks the real TTFT.
func (s *Server) streamSSE(w http.ResponseWriter, r *http.Request, g *generation, src source) {
	ctx := r.Context()
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush()

	c := chunk{ID: g.id, Model: g.model, Created: g.created, Object: "text_completion"}
	if g.chat {
		c.Object = "chat.completion.chunk"
	}
	if g.includeUsage {
		c.Usage = json.RawMessage("null")
	}
	send := func(choices any) bool {
		c.Choices = choices
		b, err := json.Marshal(c)
		if err != nil {
			return false
		}
		_, err = w.Write(append(append([]byte("data: "), b...), '\n', '\n'))
		return err == nil
	}
	seen := 0
	for {
		p, err := src.next(ctx, seen)
		if err != nil {
			if ctx.Err() == nil {
				// Status is sent: report the failure in-band and end the
				// stream without [DONE], so it cannot pass for complete.
				_, _ = w.Write(append(append([]byte("data: "), apiErrorBody(err)...), '\n', '\n'))
				_ = rc.Flush()
			}
			return
		}
		var promptIDs []uint32 // a completions stream's first token carries them
		if seen == 0 && p.tokens > 0 && g.returnTokenIDs {
			promptIDs = g.prompt.tokenIDs()
		}
		if seen == 0 && p.tokens > 0 && g.chat {
			c.PromptTokenIDs, promptIDs = promptIDs, nil
			ok := send([]chatChoice{{Delta: &chatDelta{Role: "assistant"}}})
			c.PromptTokenIDs = nil
			if !ok {
				return
			}
		}
		for i := seen; i < p.tokens; i++ {
			tc := g.tokenChoice(s.words.word(g.seed, g.from+i), nil)
			if g.returnTokenIDs {
				id := []uint32{s.words.id(g.seed, g.from+i)}
				switch tc := tc.(type) {
				case []chatChoice:
					tc[0].TokenIDs = id
				case []textChoice:
					tc[0].TokenIDs, tc[0].PromptTokenIDs, promptIDs = id, promptIDs, nil
				}
			}
			if !send(tc) {
				return
			}
		}
		seen = p.tokens
		if p.done {
			reason := g.reason
			send(g.tokenChoice("", &reason))
			if g.includeUsage {
				u, _ := json.Marshal(g.usage(p))
				c.Usage = u
				send([]struct{}{})
			}
			_, _ = w.Write([]byte("data: [DONE]\n\n"))
			_ = rc.Flush()
			return
		}
		if rc.Flush() != nil {
			return
		}
	}
}

func (g *generation) tokenChoice(text string, reason *string) any {
	if g.chat {
		d := &chatDelta{Content: text}
		return []chatChoice{{FinishReason: reason, Delta: d}}
	}
	return []textChoice{{Text: text, FinishReason: reason}}
}

func apiErrorBody(err error) []byte {
	var ee *engineError
	if !errors.As(apiError(err), &ee) {
		ee = errorf(http.StatusInternalServerError, "%v", err)
	}
	return ee.body()
}

// fixedDelay waits d or until ctx ends.
func fixedDelay(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
