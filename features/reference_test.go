package features

// The parser as it was before the single-pass scanner: encoding/json into
// raw fields, then one decode per message. It is kept here as the oracle the
// differential test and fuzz target hold the fast path to.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/switchyard-llm/switchyard/subjects"
)

// refBody is the top level of a request. Polymorphic fields stay raw so a wrong
// type is reported with its own param instead of a generic decode error.
type refBody struct {
	Model               json.RawMessage `json:"model"`
	Stream              json.RawMessage `json:"stream"`
	StreamOptions       json.RawMessage `json:"stream_options"`
	MaxTokens           json.RawMessage `json:"max_tokens"`
	MaxCompletionTokens json.RawMessage `json:"max_completion_tokens"`
	Messages            json.RawMessage `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	Input               json.RawMessage `json:"input"`
	// The Anthropic Messages API's system prompt; the Responses API's
	// instructions, output limit and previous turn.
	System             json.RawMessage `json:"system"`
	Instructions       json.RawMessage `json:"instructions"`
	MaxOutputTokens    json.RawMessage `json:"max_output_tokens"`
	PreviousResponseID json.RawMessage `json:"previous_response_id"`
	N                  json.RawMessage `json:"n"`
	BestOf             json.RawMessage `json:"best_of"`
}

// refParseRequestInto parses b into r, reusing r.Prompt's storage. endpoint
// decides which field is required: messages for /v1/chat/completions and
// /v1/messages, prompt for /v1/completions, input for /v1/embeddings and
// /v1/responses; "" requires none. The prompt is rendered from messages,
// else prompt, else input; the Messages API's system prompt and the
// Responses API's instructions come first, as a system message would.
func refParseRequestInto(r *Request, endpoint string, b []byte) error {
	*r = Request{Prompt: r.Prompt[:0]}
	var w refBody
	if err := json.Unmarshal(b, &w); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field == "" {
			return perr("", "the request body must be a JSON object")
		}
		return perr("", "malformed JSON: "+err.Error())
	}
	// encoding/json silently replaces invalid UTF-8 with U+FFFD; an engine
	// would see a different prompt than the client sent, so refuse it.
	if !utf8.Valid(b) {
		return perr(refInvalidUTF8Param(&w), "strings must be valid UTF-8")
	}
	if err := w.refScalars(r); err != nil {
		return err
	}
	r.HasMessages, r.HasPrompt, r.HasInput = refPresent(w.Messages), refPresent(w.Prompt), refPresent(w.Input)
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
		r.Prompt, err = refAppendSystem(r.Prompt, "system", w.System)
	case subjects.EndpointResponses:
		r.Prompt, err = refAppendSystem(r.Prompt, "instructions", w.Instructions)
	}
	if err != nil {
		return err
	}
	switch {
	case endpoint == subjects.EndpointResponses:
		r.Prompt, err = refAppendInput(r.Prompt, w.Input)
	case r.HasMessages:
		r.Prompt, err = refAppendMessages(r.Prompt, w.Messages)
	case r.HasPrompt:
		r.Prompt, exact, err = refAppendPromptField(r.Prompt, "prompt", w.Prompt)
	case r.HasInput:
		r.Prompt, exact, err = refAppendPromptField(r.Prompt, "input", w.Input)
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

// scalars decodes model, stream, stream_options and the token limits.
func (w *refBody) refScalars(r *Request) error {
	if !refPresent(w.Model) {
		return perr("model", "you must provide a model parameter")
	}
	if err := json.Unmarshal(w.Model, &r.Model); err != nil {
		return perr("model", "must be a string")
	}
	if r.Model == "" {
		return perr("model", "you must provide a model parameter")
	}
	if len(r.Model) > subjects.MaxModelChars {
		return perr("model", "must be at most "+strconv.Itoa(subjects.MaxModelChars)+" characters")
	}
	for _, c := range [...]struct {
		param string
		raw   json.RawMessage
	}{{"n", w.N}, {"best_of", w.BestOf}} {
		var n float64
		if refPresent(c.raw) && (json.Unmarshal(c.raw, &n) != nil || n != 1) {
			return perr(c.param, "must be 1: a request is answered once")
		}
	}
	if refPresent(w.Stream) {
		if err := json.Unmarshal(w.Stream, &r.Stream); err != nil {
			return perr("stream", "must be a boolean")
		}
	}
	if refPresent(w.StreamOptions) {
		var so struct {
			IncludeUsage json.RawMessage `json:"include_usage"`
		}
		if err := json.Unmarshal(w.StreamOptions, &so); err != nil {
			return perr("stream_options", "must be an object")
		}
		if refPresent(so.IncludeUsage) {
			if err := json.Unmarshal(so.IncludeUsage, &r.IncludeUsage); err != nil {
				return perr("stream_options.include_usage", "must be a boolean")
			}
		}
	}
	mt, err := refTokenLimit("max_tokens", w.MaxTokens)
	if err != nil {
		return err
	}
	mct, err := refTokenLimit("max_completion_tokens", w.MaxCompletionTokens)
	if err != nil {
		return err
	}
	if mct != nil {
		mt = mct
	}
	mot, err := refTokenLimit("max_output_tokens", w.MaxOutputTokens)
	if err != nil {
		return err
	}
	if mot != nil {
		mt = mot
	}
	r.MaxTokens = mt
	if refPresent(w.PreviousResponseID) {
		if err := json.Unmarshal(w.PreviousResponseID, &r.PreviousResponseID); err != nil || !ValidResponseID(r.PreviousResponseID) {
			return perr("previous_response_id", "must be a response id: 1 to 128 letters, digits, '-' or '_'")
		}
	}
	return nil
}

// refAppendSystem renders a system prompt (a string or text blocks) as a
// system message would render.
func refAppendSystem(dst []byte, param string, raw json.RawMessage) ([]byte, error) {
	if !refPresent(raw) {
		return dst, nil
	}
	dst = append(dst, "system\n"...)
	dst, err := refAppendContent(dst, param, raw)
	return append(dst, '\n'), err
}

// refAppendInput renders the Responses API's input: a string is one user
// message, an array is its items.
func refAppendInput(dst []byte, raw json.RawMessage) ([]byte, error) {
	if refIsString(raw) {
		dst = append(dst, "user\n"...)
		return append(refAppendJSONString(dst, raw), '\n'), nil
	}
	return refAppendItems(dst, "input", raw, true)
}

// refTokenLimit decodes an optional positive integer no larger than
// MaxTokensLimit. An integral float (100.0) is accepted.
func refTokenLimit(param string, raw json.RawMessage) (*int, error) {
	if !refPresent(raw) {
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

// refPresent reports whether a field was given with a non-null value.
func refPresent(raw json.RawMessage) bool {
	return len(raw) > 0 && !bytes.Equal(raw, []byte("null"))
}

// refInvalidUTF8Param names the top-level field holding invalid UTF-8, when it
// is one we know.
func refInvalidUTF8Param(w *refBody) string {
	for _, f := range [...]struct {
		name string
		raw  json.RawMessage
	}{{"model", w.Model}, {"messages", w.Messages}, {"prompt", w.Prompt}, {"input", w.Input}, {"system", w.System}, {"instructions", w.Instructions}} {
		if !utf8.Valid(f.raw) {
			return f.name
		}
	}
	return ""
}

// refAppendMessages renders a chat messages array (an Anthropic messages
// array renders the same way).
func refAppendMessages(dst []byte, raw json.RawMessage) ([]byte, error) {
	return refAppendItems(dst, "messages", raw, false)
}

// refAppendItems renders an array of messages named param. With lenient (the
// Responses API's input items), items without a role, such as tool calls
// and their outputs, contribute nothing.
func refAppendItems(dst []byte, param string, raw json.RawMessage, lenient bool) ([]byte, error) {
	var msgs []json.RawMessage
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return dst, perr(param, "must be an array of message objects")
	}
	if len(msgs) == 0 {
		return dst, perr(param, "must not be empty")
	}
	for i, m := range msgs {
		var msg struct {
			Role    json.RawMessage `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if err := json.Unmarshal(m, &msg); err != nil {
			return dst, perr(refIndex(param, i), "must be a message object")
		}
		if lenient && !refPresent(msg.Role) {
			continue
		}
		if !refIsString(msg.Role) || len(msg.Role) == 2 {
			return dst, perr(refIndex(param, i)+".role", "must be a non-empty string")
		}
		dst = refAppendJSONString(dst, msg.Role)
		dst = append(dst, '\n')
		var err error
		if dst, err = refAppendContent(dst, refIndex(param, i)+".content", msg.Content); err != nil {
			return dst, err
		}
		dst = append(dst, '\n')
	}
	return dst, nil
}

// refIndex renders a param such as "messages[3]"; only built for an error.
func refIndex(param string, i int) string { return param + "[" + strconv.Itoa(i) + "]" }

// refAppendContent renders the content of message msg: a string, an array of
// content parts, or null/absent (an assistant message with only tool calls).
func refAppendContent(dst []byte, param string, raw json.RawMessage) ([]byte, error) {
	switch {
	case !refPresent(raw):
		return dst, nil
	case refIsString(raw):
		return refAppendJSONString(dst, raw), nil
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(raw, &parts); err != nil {
		return dst, perr(param, "must be a string or an array of content parts")
	}
	for j, pr := range parts {
		var part struct {
			Type json.RawMessage `json:"type"`
			Text json.RawMessage `json:"text"`
		}
		if err := json.Unmarshal(pr, &part); err != nil {
			return dst, perr(refIndex(param, j), "must be a content part object")
		}
		if !refIsString(part.Type) {
			return dst, perr(refIndex(param, j)+".type", "must be a string")
		}
		switch string(part.Type) {
		case `"text"`, `"input_text"`, `"output_text"`: // chat and Anthropic; the Responses API
		default:
			continue
		}
		if !refIsString(part.Text) {
			return dst, perr(refIndex(param, j)+".text", "must be a string")
		}
		dst = refAppendJSONString(dst, part.Text)
	}
	return dst, nil
}

// refAppendPromptField renders a completions prompt or an embeddings input: a
// string, an array of strings, an array of token ids, or an array of arrays
// of token ids. exact is the token count when ids were given, else -1.
func refAppendPromptField(dst []byte, param string, raw json.RawMessage) (out []byte, exact int, err error) {
	if refIsString(raw) {
		return refAppendJSONString(dst, raw), -1, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return dst, -1, perr(param, "must be a string, an array of strings or an array of token ids")
	}
	if len(items) == 0 {
		return dst, -1, perr(param, "must not be empty")
	}
	if refIsString(items[0]) {
		for i, it := range items {
			if !refIsString(it) {
				return dst, -1, perr(refIndex(param, i), "must be a string like the other items")
			}
			if i > 0 {
				dst = append(dst, '\n')
			}
			dst = refAppendJSONString(dst, it)
		}
		return dst, -1, nil
	}
	if len(items[0]) > 0 && items[0][0] == '[' {
		n := 0
		for i, it := range items {
			var ids []json.RawMessage
			if err := json.Unmarshal(it, &ids); err != nil || len(ids) == 0 {
				return dst, -1, perr(refIndex(param, i), "must be a non-empty array of token ids")
			}
			if dst, err = refAppendTokenIDs(dst, refIndex(param, i), ids); err != nil {
				return dst, -1, err
			}
			n += len(ids)
		}
		return dst, n, nil
	}
	dst, err = refAppendTokenIDs(dst, param, items)
	return dst, len(items), err
}

func refAppendTokenIDs(dst []byte, param string, ids []json.RawMessage) ([]byte, error) {
	for i, id := range ids {
		v, err := strconv.ParseUint(string(id), 10, 32)
		if err != nil {
			return dst, perr(refIndex(param, i), "must be a token id (an integer from 0 to 4294967295)")
		}
		dst = binary.LittleEndian.AppendUint32(dst, uint32(v))
	}
	return dst, nil
}

func refIsString(raw json.RawMessage) bool { return len(raw) >= 2 && raw[0] == '"' }

// refAppendJSONString appends the decoded value of a JSON string literal that
// encoding/json has already validated, without an intermediate string. It
// decodes exactly as encoding/json does, lone surrogates becoming U+FFFD.
func refAppendJSONString(dst []byte, lit []byte) []byte {
	s := lit[1 : len(lit)-1]
	for i := 0; i < len(s); {
		c := s[i]
		if c != '\\' {
			j := i + 1
			for j < len(s) && s[j] != '\\' {
				j++
			}
			dst = append(dst, s[i:j]...)
			i = j
			continue
		}
		if i+1 >= len(s) {
			break
		}
		switch e := s[i+1]; e {
		case 'b':
			dst, i = append(dst, '\b'), i+2
		case 'f':
			dst, i = append(dst, '\f'), i+2
		case 'n':
			dst, i = append(dst, '\n'), i+2
		case 'r':
			dst, i = append(dst, '\r'), i+2
		case 't':
			dst, i = append(dst, '\t'), i+2
		case 'u':
			r := refHex4(s[i+2:])
			i += 6
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
					r2 = refHex4(s[i+2:])
				}
				if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
					r, i = dec, i+6
				} else {
					r = utf8.RuneError
				}
			}
			dst = utf8.AppendRune(dst, r)
		default: // '"', '\\', '/'
			dst, i = append(dst, e), i+2
		}
	}
	return dst
}

func refHex4(b []byte) rune {
	if len(b) < 4 {
		return utf8.RuneError
	}
	v, err := strconv.ParseUint(string(b[:4]), 16, 32)
	if err != nil {
		return utf8.RuneError
	}
	return rune(v)
}

// refIsCode is a cheap heuristic: a fenced ``` block, or at least codeLines
// lines that start with a keyword of a common language or a closing "}", end
// the way code lines do (";", "{"), or hold an arrow "=>". It reads the prompt once and
// allocates nothing; a wrong guess only costs a cheaper or dearer model.
func refIsCode(prompt []byte) bool {
	if bytes.Contains(prompt, []byte("```")) {
		return true
	}
	n := 0
	for len(prompt) > 0 {
		line := prompt
		if i := bytes.IndexByte(prompt, '\n'); i >= 0 {
			line, prompt = prompt[:i], prompt[i+1:]
		} else {
			prompt = nil
		}
		if refCodeLine(line) {
			if n++; n >= codeLines {
				return true
			}
		}
	}
	return false
}

var refCodeStarts = [...]string{
	"def ", "func ", "class ", "#include", "import ", "package ", "fn ",
	"public ", "private ", "const ", "let ", "var ", "return ", "if (", "for (",
	"while (", "#!/", "SELECT ", "select ",
}

func refCodeLine(line []byte) bool {
	line = bytes.TrimRight(line, " \t\r")
	t := bytes.TrimLeft(line, " \t")
	if len(t) == 0 {
		return false
	}
	if last := t[len(t)-1]; last == ';' || last == '{' || t[0] == '}' {
		return true
	}
	if bytes.Contains(t, []byte("=>")) {
		return true
	}
	for _, s := range refCodeStarts {
		if len(t) >= len(s) && string(t[:len(s)]) == s {
			return true
		}
	}
	return false
}
