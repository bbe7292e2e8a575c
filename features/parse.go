package features

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"github.com/switchyard-llm/switchyard/internal/jsonscan"
	"github.com/switchyard-llm/switchyard/subjects"
)

// MaxTokensLimit bounds max_tokens: a larger value is a client bug, not a
// request any engine can honour.
const MaxTokensLimit = 1 << 20

// Request is what routing needs from an OpenAI request body.
type Request struct {
	Model        string
	Stream       bool
	IncludeUsage bool // stream_options.include_usage
	// MaxTokens is max_completion_tokens, else max_tokens; nil when absent.
	MaxTokens *int

	HasMessages, HasPrompt, HasInput bool

	// PreviousResponseID is the Responses API's previous_response_id: the
	// stored response this turn continues.
	PreviousResponseID string

	// Prompt is the canonical prompt (see AppendPrompt for the rendering).
	Prompt []byte
	// PromptTokens is exact when ExactTokens (the body carried token ids),
	// else EstimateTokens(len(Prompt)).
	PromptTokens int
	ExactTokens  bool
}

// ParseError is a request the gateway answers with 400 invalid_request_error.
// Param names the offending field in OpenAI's style ("messages[2].content").
type ParseError struct {
	Param   string
	Message string
}

func (e *ParseError) Error() string {
	if e.Param == "" {
		return e.Message
	}
	return e.Param + ": " + e.Message
}

// APIError renders the error as the 400 the gateway returns.
func (e *ParseError) APIError() *subjects.APIError {
	a := subjects.NewError(400, subjects.CodeInvalidRequest, e.Error())
	a.Param = e.Param
	return a
}

func perr(param, msg string) error { return &ParseError{Param: param, Message: msg} }

// ParseRequest parses an OpenAI request body for endpoint (see
// ParseRequestInto). Errors are *ParseError.
func ParseRequest(endpoint string, b []byte) (*Request, error) {
	r := new(Request)
	if err := ParseRequestInto(r, endpoint, b); err != nil {
		return nil, err
	}
	return r, nil
}

// ParseRequestInto parses b into r, reusing r.Prompt's storage. endpoint
// decides which field is required: messages for /v1/chat/completions and
// /v1/messages, prompt for /v1/completions, input for /v1/embeddings and
// /v1/responses; "" requires none. The prompt is rendered from messages,
// else prompt, else input; the Messages API's system prompt and the
// Responses API's instructions come first, as a system message would.
//
// It accepts and refuses exactly what decoding into Go values with
// encoding/json would (keys matched case-insensitively, the last of
// duplicates kept, nesting up to 10,000 deep), and refuses invalid UTF-8
// besides, reading the body in two passes without decoding it (fields.go). It
// allocates the model name and nothing else when r.Prompt has room.
func ParseRequestInto(r *Request, endpoint string, b []byte) error {
	*r = Request{Prompt: r.Prompt[:0]}
	var f [numFields][]byte
	scan, ok := jsonscan.Validate(b, func(k jsonscan.Key, v []byte) {
		if i := topField(k); i >= 0 {
			f[i] = v // the last of duplicates, as encoding/json keeps
		}
	})
	if !ok {
		return syntaxError(b)
	}
	// null leaves a struct untouched in encoding/json: no fields.
	if scan.Top != '{' && scan.Top != 'n' {
		return perr("", "the request body must be a JSON object")
	}
	// encoding/json silently replaces invalid UTF-8 with U+FFFD; an engine
	// would see a different prompt than the client sent, so refuse it.
	if scan.BadUTF8 {
		return perr(invalidUTF8Param(&f), "strings must be valid UTF-8")
	}
	if err := scalars(r, &f); err != nil {
		return err
	}
	r.HasMessages, r.HasPrompt, r.HasInput = present(f[fMessages]), present(f[fPrompt]), present(f[fInput])
	switch endpoint {
	case subjects.EndpointChat, subjects.EndpointMessages:
		if !r.HasMessages {
			return perr("messages", "messages is required")
		}
	case subjects.EndpointCompletions:
		if !r.HasPrompt {
			return perr("prompt", "prompt is required")
		}
	case subjects.EndpointEmbeddings, subjects.EndpointResponses:
		if !r.HasInput {
			return perr("input", "input is required")
		}
	}
	var err error
	exact := -1
	switch endpoint {
	case subjects.EndpointMessages:
		r.Prompt, err = appendSystem(r.Prompt, "system", f[fSystem])
	case subjects.EndpointResponses:
		r.Prompt, err = appendSystem(r.Prompt, "instructions", f[fInstructions])
	}
	if err != nil {
		return err
	}
	switch {
	case endpoint == subjects.EndpointResponses:
		r.Prompt, err = appendInput(r.Prompt, f[fInput])
	case r.HasMessages:
		r.Prompt, err = appendMessages(r.Prompt, f[fMessages])
	case r.HasPrompt:
		r.Prompt, exact, err = appendPromptField(r.Prompt, "prompt", f[fPrompt])
	case r.HasInput:
		r.Prompt, exact, err = appendPromptField(r.Prompt, "input", f[fInput])
	}
	if err != nil {
		return err
	}
	if exact >= 0 {
		r.PromptTokens, r.ExactTokens = exact, true
	} else {
		r.PromptTokens = EstimateTokens(len(r.Prompt))
	}
	return nil
}

// syntaxError is the error of a body that is not JSON, worded as
// encoding/json words it.
func syntaxError(b []byte) error {
	var v json.RawMessage
	if err := json.Unmarshal(b, &v); err != nil {
		return perr("", "malformed JSON: "+err.Error())
	}
	return perr("", "malformed JSON")
}

// scalars decodes model, stream, stream_options and the token limits.
func scalars(r *Request, f *[numFields][]byte) error {
	model := f[fModel]
	if !present(model) {
		return perr("model", "you must provide a model parameter")
	}
	if !isString(model) {
		return perr("model", "must be a string")
	}
	if bytes.IndexByte(model, '\\') < 0 {
		r.Model = string(model[1 : len(model)-1])
	} else {
		var tmp [64]byte
		r.Model = string(jsonscan.AppendString(tmp[:0], model))
	}
	if r.Model == "" {
		return perr("model", "you must provide a model parameter")
	}
	if len(r.Model) > subjects.MaxModelChars {
		return perr("model", "must be at most "+strconv.Itoa(subjects.MaxModelChars)+" characters")
	}
	// The quota reserves one answer of max_tokens; several answers would
	// generate past it.
	for _, c := range [...]struct {
		param string
		field int
	}{{"n", fN}, {"best_of", fBestOf}} {
		if v := f[c.field]; present(v) {
			if n, err := strconv.ParseFloat(string(v), 64); err != nil || n != 1 {
				return perr(c.param, "must be 1: a request is answered once")
			}
		}
	}
	if present(f[fStream]) {
		v, ok := boolean(f[fStream])
		if !ok {
			return perr("stream", "must be a boolean")
		}
		r.Stream = v
	}
	if so := f[fStreamOptions]; present(so) {
		if so[0] != '{' {
			return perr("stream_options", "must be an object")
		}
		iu, _ := jsonscan.Lookup2Fold(so, "include_usage", "")
		if present(iu) {
			v, ok := boolean(iu)
			if !ok {
				return perr("stream_options.include_usage", "must be a boolean")
			}
			r.IncludeUsage = v
		}
	}
	mt, err := tokenLimit("max_tokens", f[fMaxTokens])
	if err != nil {
		return err
	}
	mct, err := tokenLimit("max_completion_tokens", f[fMaxCompletionTokens])
	if err != nil {
		return err
	}
	if mct != nil {
		mt = mct
	}
	mot, err := tokenLimit("max_output_tokens", f[fMaxOutputTokens])
	if err != nil {
		return err
	}
	if mot != nil {
		mt = mot
	}
	r.MaxTokens = mt
	if id := f[fPreviousResponseID]; present(id) {
		if isString(id) {
			r.PreviousResponseID = string(jsonscan.AppendString(nil, id))
		}
		if !isString(id) || !ValidResponseID(r.PreviousResponseID) {
			return perr("previous_response_id", "must be a response id: 1 to 128 letters, digits, '-' or '_'")
		}
	}
	return nil
}

// ValidResponseID reports whether id can name a stored response: it
// becomes a key of the response-owner bucket, so only key-safe characters.
func ValidResponseID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// appendSystem renders a system prompt (a string or text blocks) as a
// system message would render.
func appendSystem(dst []byte, param string, raw []byte) ([]byte, error) {
	if !present(raw) {
		return dst, nil
	}
	dst = append(dst, "system\n"...)
	dst, err := appendContent(dst, param, raw)
	return append(dst, '\n'), err
}

// appendInput renders the Responses API's input: a string is one user
// message, an array is its items.
func appendInput(dst []byte, raw []byte) ([]byte, error) {
	if isString(raw) {
		dst = append(dst, "user\n"...)
		return append(jsonscan.AppendString(dst, raw), '\n'), nil
	}
	return appendItems(dst, "input", raw, true)
}

// boolean decodes a valid JSON value that must be true or false.
func boolean(v []byte) (val, ok bool) {
	switch string(v) {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	return false, false
}

// tokenLimit decodes an optional positive integer no larger than
// MaxTokensLimit. An integral float (100.0) is accepted.
func tokenLimit(param string, raw []byte) (*int, error) {
	if !present(raw) {
		return nil, nil
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		f, ferr := strconv.ParseFloat(string(raw), 64)
		if ferr != nil || f != float64(int64(f)) {
			return nil, perr(param, "must be an integer")
		}
		n = int64(f)
	}
	if n < 1 {
		// A limit of 0 is refused: the token quota reserves the limit
		// and the engine is held to it, and for chat engines refuse 0
		// themselves ("max_tokens must be at least 1").
		return nil, perr(param, "must be at least 1")
	}
	if n > MaxTokensLimit {
		return nil, perr(param, "must be at most "+strconv.Itoa(MaxTokensLimit))
	}
	v := int(n)
	return &v, nil
}

// present reports whether a field was given with a non-null value.
func present(raw []byte) bool {
	return len(raw) > 0 && string(raw) != "null"
}

// invalidUTF8Param names the top-level field holding invalid UTF-8, when it
// is one we know.
func invalidUTF8Param(f *[numFields][]byte) string {
	for _, k := range [...]int{fModel, fMessages, fPrompt, fInput, fSystem, fInstructions} {
		if !utf8.Valid(f[k]) {
			return fieldName(k)
		}
	}
	return ""
}

// EstimateTokens is the token estimate for n bytes of prompt: n/4, rounded up.
func EstimateTokens(n int) int { return (n + 3) / 4 }
