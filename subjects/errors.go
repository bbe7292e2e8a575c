package subjects

import (
	"encoding/json"
	"strconv"
	"time"
)

// Error codes of docs/protocol.md, "Errors". The OpenAI error shape carries them in
// "code"; the HTTP status travels as Llm-Status over NATS.
const (
	CodeInvalidRequest     = "invalid_request_error"
	CodeContextLength      = "context_length_exceeded"
	CodeInvalidAPIKey      = "invalid_api_key"
	CodeModelNotAllowed    = "model_not_allowed"
	CodeModelNotFound      = "model_not_found"
	CodeRequestTooLarge    = "request_too_large"
	CodeRequestTimeout     = "request_timeout"
	CodeRateLimit          = "rate_limit_exceeded"
	CodeUpstreamError      = "upstream_error"
	CodeUpstreamTimeout    = "upstream_timeout"
	CodeAllReplicasBusy    = "all_replicas_busy"
	CodeDeadlineUnmeetable = "deadline_unmeetable"
	// CodeTTFTObjectiveUnreachable (503): no candidate's predicted time to
	// first token meets the request's TTFT objective.
	CodeTTFTObjectiveUnreachable = "ttft_objective_unreachable"
	CodeModelLoading             = "model_loading"
	CodeNoReplicas               = "no_replicas"
	CodeRouterUnavailable        = "router_unavailable"
	// CodeGatewayOverloaded (503): the gateway is at its adaptive
	// concurrency limit (or --max-inflight); refused before the body is
	// read.
	CodeGatewayOverloaded = "gateway_overloaded"
	CodeNotFound          = "not_found"
	CodeMethodNotAllowed  = "method_not_allowed"
	// CodeEndpointNotSupported (501): no replica of the model serves the endpoint.
	CodeEndpointNotSupported = "endpoint_not_supported"
	// CodePreviousResponseNotFound (404): the stored response is unknown,
	// expired, another tenant's, or its replica is gone or draining.
	CodePreviousResponseNotFound = "previous_response_not_found"
	// CodeFairShareExceeded (429): the pool sheds and the tenant holds more
	// than its fair share of the pool's tokens in flight.
	CodeFairShareExceeded = "fair_share_exceeded"
	// CodeBudgetExceeded (429): the request's worst-case cost does not fit
	// in what is left of its tenant's or its key's spend budget.
	CodeBudgetExceeded = "budget_exceeded"
)

// APIError is a request failure in the OpenAI error shape. It is produced in
// one place and rendered the same over HTTP and NATS.
type APIError struct {
	Status     int
	Code       string
	Message    string
	Param      string
	RetryAfter time.Duration
	// Headers are extra response headers (x-ratelimit-*).
	Headers map[string]string
}

func (e *APIError) Error() string { return strconv.Itoa(e.Status) + " " + e.Code + ": " + e.Message }

// Type is the OpenAI error "type" for the status.
func (e *APIError) Type() string {
	switch {
	case e.Status == 401:
		return "authentication_error"
	case e.Status == 403:
		return "permission_error"
	case e.Status == 404:
		return "not_found_error"
	case e.Status == 429:
		return "rate_limit_error"
	case e.Status >= 500:
		return "server_error"
	default:
		return "invalid_request_error"
	}
}

// ErrorBody is the JSON object {"error":{...}}.
type ErrorBody struct {
	Error ErrorObject `json:"error"`
}

// ErrorObject is OpenAI's error object.
type ErrorObject struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    any     `json:"code"`
}

// Body renders the error in the OpenAI shape.
func (e *APIError) Body() []byte {
	var param *string
	if e.Param != "" {
		param = &e.Param
	}
	b, _ := json.Marshal(ErrorBody{Error: ErrorObject{Message: e.Message, Type: e.Type(), Param: param, Code: e.Code}})
	return b
}

// RetryAfterHeaders returns Retry-After (whole seconds, rounded up) and
// retry-after-ms, or nil when the error has no retry hint.
func (e *APIError) RetryAfterHeaders() [][2]string {
	if e.RetryAfter <= 0 {
		return nil
	}
	secs := int64((e.RetryAfter + time.Second - 1) / time.Second)
	return [][2]string{
		{HdrRetryAfter, strconv.FormatInt(secs, 10)},
		{HdrRetryAfterMS, strconv.FormatInt(e.RetryAfter.Milliseconds(), 10)},
	}
}

// NewError builds an APIError.
func NewError(status int, code, msg string) *APIError {
	return &APIError{Status: status, Code: code, Message: msg}
}
