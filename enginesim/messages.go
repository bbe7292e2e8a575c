package enginesim

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
)

// The Anthropic Messages API as vLLM serves it (/v1/messages): Anthropic's
// request, answer, stream events and error shape.

type messagesRequest struct {
	Model     string          `json:"model"`
	MaxTokens *int            `json:"max_tokens"`
	System    json.RawMessage `json:"system"`
	Messages  []chatMessage   `json:"messages"`
	Stream    bool            `json:"stream"`
}

type anthropicMessage struct {
	ID           string           `json:"id"`
	Type         string           `json:"type"`
	Role         string           `json:"role"`
	Model        string           `json:"model"`
	Content      []anthropicBlock `json:"content"`
	StopReason   *string          `json:"stop_reason"`
	StopSequence *string          `json:"stop_sequence"`
	Usage        anthropicUsage   `json:"usage"`
}

type anthropicBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type anthropicUsage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

// writeAnthropicError answers err in Anthropic's shape.
func writeAnthropicError(w http.ResponseWriter, err error) {
	var ee *engineError
	if !errors.As(err, &ee) {
		ee = errorf(http.StatusInternalServerError, "%v", err)
	}
	if ee.retryAfter > 0 {
		w.Header().Set("Retry-After", "1")
	}
	writeJSONBytes(w, ee.status, anthropicErrorBody(ee))
}

func anthropicErrorBody(ee *engineError) []byte {
	typ := "invalid_request_error"
	switch {
	case ee.status == http.StatusNotFound:
		typ = "not_found_error"
	case ee.status == http.StatusServiceUnavailable:
		typ = "overloaded_error"
	case ee.status >= 500:
		typ = "api_error"
	}
	b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": ee.message}})
	return b
}

func (s *Server) handleMessages(w http.ResponseWriter, r *http.Request) {
	var req messagesRequest
	if err := decode(r, w, &req); err != nil {
		writeAnthropicError(w, err)
		return
	}
	if req.MaxTokens == nil {
		writeAnthropicError(w, errorf(http.StatusBadRequest, "max_tokens: Field required"))
		return
	}
	g, err := s.newGeneration(w, false, req.Model, req.MaxTokens, req.Stream, nil, s.promptInput(func() (prompt, error) {
		if len(req.Messages) == 0 {
			return prompt{}, errorf(http.StatusBadRequest, "messages: at least one message is required")
		}
		system, err := contentText(req.System, "")
		if err != nil {
			return prompt{}, errorf(http.StatusBadRequest, "system: %v", err)
		}
		p, err := chatPrompt(req.Messages)
		if err != nil {
			return prompt{}, errorf(http.StatusBadRequest, "%v", err)
		}
		if system != "" {
			p = textPrompt("<|system|>" + system + "\n" + p.text)
		}
		return p, nil
	}))
	if err != nil {
		writeAnthropicError(w, err)
		return
	}
	g.id = "msg_" + strings.ReplaceAll(w.Header().Get("X-Request-Id"), "-", "")
	stop := "end_turn"
	if g.reason == "length" {
		stop = "max_tokens"
	}
	msg := anthropicMessage{ID: g.id, Type: "message", Role: "assistant", Model: g.model, Content: []anthropicBlock{},
		Usage: anthropicUsage{InputTokens: g.prompt.tokens}}
	a := &answer{s: s, w: w, r: r, g: g, writeErr: writeAnthropicError}
	a.finish = func(p progress) []byte {
		msg.Content = []anthropicBlock{{Type: "text", Text: s.words.answer(g.seed, 0, p.tokens)}}
		msg.StopReason, msg.Usage.OutputTokens = &stop, p.tokens
		b, _ := json.Marshal(msg)
		return b
	}
	if !req.Stream {
		a.whole()
		return
	}
	ev := func(typ string, v map[string]any) []byte {
		v["type"] = typ
		b, _ := json.Marshal(v)
		return sseBytes(typ, b)
	}
	a.stream(func() []byte {
		out := ev("message_start", map[string]any{"message": msg})
		out = append(out, ev("content_block_start", map[string]any{"index": 0, "content_block": anthropicBlock{Type: "text"}})...)
		return append(out, ev("ping", map[string]any{})...)
	}, func(word string) []byte {
		return ev("content_block_delta", map[string]any{"index": 0, "delta": map[string]string{"type": "text_delta", "text": word}})
	}, func(p progress) []byte {
		out := ev("content_block_stop", map[string]any{"index": 0})
		out = append(out, ev("message_delta", map[string]any{"delta": map[string]any{"stop_reason": stop, "stop_sequence": nil},
			"usage": map[string]int{"output_tokens": p.tokens}})...)
		return append(out, ev("message_stop", map[string]any{})...)
	}, func(err error) []byte {
		var ee *engineError
		if !errors.As(err, &ee) {
			ee = errorf(http.StatusInternalServerError, "%v", err)
		}
		return sseBytes("error", anthropicErrorBody(ee))
	})
}
