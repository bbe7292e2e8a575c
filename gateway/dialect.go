package gateway

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/switchyard-llm/switchyard/subjects"
)

// dialect is the API family an endpoint belongs to: it decides the shape of
// an error, before the first byte and inside a stream, since every SDK
// parses only its own.
type dialect uint8

const (
	dialectOpenAI    dialect = iota // chat, completions, embeddings: {"error":{…}}
	dialectResponses                // the OpenAI Responses API: errors as OpenAI's, stream events its own
	dialectAnthropic                // the Anthropic Messages API: {"type":"error","error":{…}}
)

func dialectOf(endpoint string) dialect {
	switch endpoint {
	case subjects.EndpointResponses:
		return dialectResponses
	case subjects.EndpointMessages:
		return dialectAnthropic
	}
	return dialectOpenAI
}

// errorBody renders e as this dialect's HTTP error body.
func (d dialect) errorBody(e *subjects.APIError) []byte {
	if d == dialectAnthropic {
		return anthropicError(e)
	}
	return e.Body()
}

// streamError is the SSE event that ends a stream which failed after its
// first byte. On chat and completions it is one data line with the error
// object and nothing after it, as vLLM sends: every OpenAI SDK (Node,
// Python, go-openai) raises the message from that line, and no [DONE]
// follows, so the stream cannot pass for a whole one. The Responses API has
// its own error event, and Anthropic's SDK reads event: error.
func (d dialect) streamError(e *subjects.APIError) []byte {
	switch d {
	case dialectResponses:
		b, _ := json.Marshal(struct {
			Type    string  `json:"type"`
			Code    string  `json:"code"`
			Message string  `json:"message"`
			Param   *string `json:"param"`
		}{"error", e.Code, e.Message, nil})
		return sseEvent("error", b)
	case dialectAnthropic:
		return sseEvent("error", anthropicError(e))
	}
	return sseEvent("", e.Body())
}

func sseEvent(event string, data []byte) []byte {
	out := make([]byte, 0, len(event)+len(data)+16)
	if event != "" {
		out = append(out, "event: "...)
		out = append(out, event...)
		out = append(out, '\n')
	}
	out = append(out, "data: "...)
	out = append(out, data...)
	return append(out, "\n\n"...)
}

// anthropicError renders e in Anthropic's shape, with the error type
// Anthropic gives the same status.
func anthropicError(e *subjects.APIError) []byte {
	type inner struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	}
	b, _ := json.Marshal(struct {
		Type  string `json:"type"`
		Error inner  `json:"error"`
	}{"error", inner{anthropicType(e.Status), e.Message}})
	return b
}

func anthropicType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	}
	if status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

// translate re-renders an error body that a broker or adapter sent in the
// OpenAI shape for a client of another dialect; other bodies pass as they
// are.
func (d dialect) translate(status int, body []byte) []byte {
	if d != dialectAnthropic || status < 400 {
		return body
	}
	var eb subjects.ErrorBody
	if json.Unmarshal(body, &eb) != nil || eb.Error.Message == "" {
		msg := string(body)
		if msg == "" {
			msg = "upstream error " + strconv.Itoa(status)
		}
		return anthropicError(&subjects.APIError{Status: status, Message: msg})
	}
	return anthropicError(&subjects.APIError{Status: status, Message: eb.Error.Message})
}
