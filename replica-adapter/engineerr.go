package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard-llm/switchyard/internal/clip"
	"github.com/switchyard-llm/switchyard/subjects"
)

// engineError translates an engine's error response into the OpenAI shape
// of docs/protocol.md, "Errors". Engines disagree on it: vLLM and llama.cpp send
// {"error":{"message","type","code":<int>}}, older vLLM a flat
// {"object":"error","message","type","code":<int>}, TGI
// {"error":"...","error_type":"..."}. A string code is kept; a number, or
// none, becomes the code that the status means.
func engineError(status int, body []byte) *subjects.APIError {
	e := subjects.NewError(status, "", "")
	var raw map[string]json.RawMessage
	if json.Unmarshal(body, &raw) == nil {
		obj := raw
		if inner, ok := raw["error"]; ok {
			var nested map[string]json.RawMessage
			if json.Unmarshal(inner, &nested) == nil {
				obj = nested
			} else {
				e.Message = jsonString(inner)
			}
		}
		if m := jsonString(obj["message"]); m != "" {
			e.Message = m
		}
		e.Param = jsonString(obj["param"])
		e.Code = jsonString(obj["code"])
	} else {
		e.Message = strings.TrimSpace(clip.Text(body, 512))
	}
	if e.Message == "" {
		e.Message = "engine answered " + httpStatusText(status)
	}
	// The message travels in one NATS message and ends up in a client's log.
	e.Message = clip.Text(e.Message, 2048)
	if e.Code == "" {
		e.Code = codeFor(status, e.Message)
	}
	return e
}

// codeFor is the OpenAI-shape code for an engine status without a string code.
func codeFor(status int, msg string) string {
	lower := strings.ToLower(msg)
	switch {
	case status == 400 && strings.Contains(lower, "context length"):
		return subjects.CodeContextLength
	case status == 400 || status == 422:
		return subjects.CodeInvalidRequest
	case status == 401:
		return subjects.CodeInvalidAPIKey
	case status == 403:
		return subjects.CodeModelNotAllowed
	case status == 404:
		return subjects.CodeModelNotFound
	case status == 413:
		return subjects.CodeRequestTooLarge
	case status == 429:
		return subjects.CodeRateLimit
	case status == 503 && strings.Contains(lower, "load"):
		return subjects.CodeModelLoading
	case status == 503:
		return subjects.CodeAllReplicasBusy
	case status == 504:
		return subjects.CodeUpstreamTimeout
	case status >= 500:
		return subjects.CodeUpstreamError
	}
	return subjects.CodeInvalidRequest
}

// jsonString returns a JSON string's value, or "" for anything else.
func jsonString(raw json.RawMessage) string {
	var s string
	if len(raw) == 0 || json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

func httpStatusText(status int) string {
	return strings.TrimSpace(strconv.Itoa(status) + " " + http.StatusText(status))
}

// callError is the error answered when the engine call failed before a head.
func callError(ctx context.Context, err error) *subjects.APIError {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return subjects.NewError(http.StatusGatewayTimeout, subjects.CodeUpstreamTimeout, "request deadline passed before the engine answered")
	case errors.Is(ctx.Err(), context.Canceled):
		return subjects.NewError(http.StatusBadGateway, subjects.CodeUpstreamError, "request cancelled before the engine answered")
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		// The engine did no work (it is down or restarting): a 503 lets the
		// gateway retry on another replica before the first byte.
		e := subjects.NewError(http.StatusServiceUnavailable, subjects.CodeUpstreamError, "engine unreachable: "+err.Error())
		e.RetryAfter = time.Second
		return e
	}
	return subjects.NewError(http.StatusBadGateway, subjects.CodeUpstreamError, "engine failed before answering: "+err.Error())
}

// streamError is the Llm-Error of an end after the engine failed mid-way.
func streamError(ctx context.Context, err error) string {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return "deadline exceeded"
	case errors.Is(ctx.Err(), context.Canceled):
		return "cancelled"
	}
	return "engine stream broke: " + err.Error()
}
