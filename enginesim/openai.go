package enginesim

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/switchyard-llm/switchyard/subjects"
)

// Wire types of the OpenAI API as vLLM serves it. Field order follows vLLM's
// responses (testdata/chat-completion.json, chat-stream-lora.sse).

type chatRequest struct {
	Model               string         `json:"model"`
	Messages            []chatMessage  `json:"messages"`
	MaxTokens           *int           `json:"max_tokens"`
	MaxCompletionTokens *int           `json:"max_completion_tokens"`
	Stream              bool           `json:"stream"`
	StreamOptions       *streamOptions `json:"stream_options"`
	// ContinueFinalMessage continues the final (assistant) message instead
	// of starting a new one; vLLM requires AddGenerationPrompt false with it
	// (its default is true).
	ContinueFinalMessage bool              `json:"continue_final_message"`
	AddGenerationPrompt  *bool             `json:"add_generation_prompt"`
	KVTransferParams     *KVTransferParams `json:"kv_transfer_params"`
	// ReturnTokenIDs asks for the prompt's token ids and the answer's,
	// as vLLM's return_token_ids does.
	ReturnTokenIDs bool  `json:"return_token_ids"`
	Priority       int64 `json:"priority"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type completionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	MaxTokens     *int            `json:"max_tokens"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`

	KVTransferParams *KVTransferParams `json:"kv_transfer_params"`
	ReturnTokenIDs   bool              `json:"return_token_ids"`
	Priority         int64             `json:"priority"`
}

type embeddingRequest struct {
	Model string          `json:"model"`
	Input json.RawMessage `json:"input"`
}

type usage struct {
	PromptTokens        int            `json:"prompt_tokens"`
	CompletionTokens    int            `json:"completion_tokens"`
	TotalTokens         int            `json:"total_tokens"`
	PromptTokensDetails *promptDetails `json:"prompt_tokens_details,omitempty"`
}

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type chatCompletion struct {
	ID      string       `json:"id"`
	Model   string       `json:"model"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Usage   *usage       `json:"usage"`
	Choices []chatChoice `json:"choices"`

	KVTransferParams *KVTransferParams `json:"kv_transfer_params,omitempty"`
	// PromptTokenIDs answers return_token_ids: the prompt's token ids
	// (a chat response carries them beside its choices, as vLLM's does).
	PromptTokenIDs []uint32 `json:"prompt_token_ids,omitempty"`
}

type chatChoice struct {
	Index        int             `json:"index"`
	FinishReason *string         `json:"finish_reason"`
	Message      *chatMessageOut `json:"message,omitempty"`
	Delta        *chatDelta      `json:"delta,omitempty"`
	// TokenIDs answers return_token_ids: the ids of the tokens this
	// choice (or chunk) carries.
	TokenIDs []uint32 `json:"token_ids,omitempty"`
}

type chatMessageOut struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatDelta struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content,omitempty"`
}

type textCompletion struct {
	ID      string       `json:"id"`
	Model   string       `json:"model"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Usage   *usage       `json:"usage"`
	Choices []textChoice `json:"choices"`

	KVTransferParams *KVTransferParams `json:"kv_transfer_params,omitempty"`
}

type textChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
	// return_token_ids: a completions choice carries its prompt's token
	// ids (in a stream, on its first chunk) and its tokens' ids, as
	// vLLM's does.
	PromptTokenIDs []uint32 `json:"prompt_token_ids,omitempty"`
	TokenIDs       []uint32 `json:"token_ids,omitempty"`
}

type embeddingList struct {
	ID      string      `json:"id"`
	Object  string      `json:"object"`
	Created int64       `json:"created"`
	Model   string      `json:"model"`
	Data    []embedding `json:"data"`
	Usage   usage       `json:"usage"`
}

type embedding struct {
	Index     int       `json:"index"`
	Object    string    `json:"object"`
	Embedding []float32 `json:"embedding"`
}

type modelList struct {
	Object string      `json:"object"`
	Data   []modelCard `json:"data"`
}

type modelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen int     `json:"max_model_len"`
}

// engineError is an error in vLLM's shape: OpenAI's error object with the
// HTTP status as an integer code and a Python exception name as type
// (testdata/error-unknown-model.json).
type engineError struct {
	status     int
	message    string
	retryAfter int // seconds; 0 for none
}

func (e *engineError) Error() string { return strconv.Itoa(e.status) + ": " + e.message }

func errorf(status int, format string, args ...any) *engineError {
	return &engineError{status: status, message: fmt.Sprintf(format, args...)}
}

func errorType(status int) string {
	switch status {
	case http.StatusNotFound:
		return "NotFoundError"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailableError"
	case http.StatusTooManyRequests:
		return "RateLimitError"
	}
	if status >= 500 {
		return "InternalServerError"
	}
	return "BadRequestError"
}

func (e *engineError) body() []byte {
	b, _ := json.Marshal(subjects.ErrorBody{Error: subjects.ErrorObject{
		Message: e.message, Type: errorType(e.status), Code: e.status,
	}})
	return b
}

func writeError(w http.ResponseWriter, err error) {
	var ee *engineError
	if !errors.As(err, &ee) {
		ee = errorf(http.StatusInternalServerError, "%v", err)
	}
	if ee.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(ee.retryAfter))
	}
	writeJSONBytes(w, ee.status, ee.body())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSONBytes(w, status, b)
}

func writeJSONBytes(w http.ResponseWriter, status int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// contentText reads a message content: a string, or an array of parts
// whose text fields are joined, of the parts of type only ("" for every
// part: the Responses API's input_text and output_text, Anthropic's text).
func contentText(raw json.RawMessage, only string) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("content must be a string or an array of parts")
	}
	var b strings.Builder
	for _, p := range parts {
		if only == "" || p.Type == only {
			b.WriteString(p.Text)
		}
	}
	return b.String(), nil
}
