// Package chunk reads and rewrites the data of one event of an
// OpenAI-compatible stream (a chat.completion.chunk or a text_completion
// chunk) without decoding it: the members Switchyard needs are found with
// jsonscan where they stand, and a rewrite splices new values into the
// chunk's own bytes. It is the one reader of that format: the gateway
// follows a streamed answer with it to continue it on another replica, and
// the adapter reads the engine's usage objects with it.
package chunk

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"github.com/switchyard-llm/switchyard/internal/jsonscan"
)

// Chunk is what Switchyard reads of one chunk. Byte slices point into the
// chunk's data (Text too, unless its literal holds an escape); they are
// valid as long as the data is.
type Chunk struct {
	// ID and Model are the string literals as they stand, quotes included;
	// nil when absent or null.
	ID, Model []byte
	// Created is the "created" value as it stands; nil when absent.
	Created []byte

	// Text is the first choice's content delta (chat) or text (completions),
	// unescaped; nil when it has none.
	Text []byte
	// Role says the first choice's delta names a role.
	Role bool
	// Finish says the first choice has a finish reason.
	Finish bool
	// Logprobs, ToolCalls and Reasoning say the first choice carries
	// log probabilities, a tool call or reasoning text.
	Logprobs, ToolCalls, Reasoning bool
	// OtherChoices says there is a choice besides the first at index 0
	// (n > 1).
	OtherChoices bool

	// Usage is the chunk's usage object; HasUsage says it has one.
	Usage    Usage
	HasUsage bool
	// Error says the chunk is an in-band error event.
	Error bool
}

// Usage is a usage object's counts: OpenAI's prompt_tokens and
// completion_tokens, or the Responses and Anthropic Messages APIs'
// input_tokens and output_tokens.
type Usage struct {
	PromptTokens, CompletionTokens int
	// HasPrompt and HasCompletion say the object names each count
	// (Anthropic's message_delta names only the output).
	HasPrompt, HasCompletion bool
}

// Read reads data, one event's data. ok is false when data is not a JSON
// object or a member Read needs has a value of the wrong type; members it
// does not need are skipped, not checked.
func Read(data []byte) (c Chunk, ok bool) {
	m := jsonscan.NewMembers(data, jsonscan.SkipSpace(data, 0))
	for m.Next() {
		k, v := m.Key(), m.Value()
		switch {
		case k.Equal("id"):
			if c.ID, ok = str(v); !ok {
				return c, false
			}
		case k.Equal("model"):
			if c.Model, ok = str(v); !ok {
				return c, false
			}
		case k.Equal("created"):
			c.Created = v
		case k.Equal("choices"):
			if !c.choices(v) {
				return c, false
			}
		case k.Equal("usage"):
			c.HasUsage = false
			if !null(v) {
				if c.Usage, ok = ReadUsage(v); !ok {
					return c, false
				}
				c.HasUsage = true
			}
		case k.Equal("error"):
			c.Error = !null(v)
		}
	}
	return c, m.End() >= 0 && jsonscan.SkipSpace(data, m.End()) == len(data)
}

// choices reads the choices array: the first choice at index 0, and
// whether there are others.
func (c *Chunk) choices(v []byte) bool {
	c.Text, c.Role, c.Finish, c.Logprobs, c.ToolCalls, c.Reasoning, c.OtherChoices = nil, false, false, false, false, false, false
	if null(v) {
		return true
	}
	e := jsonscan.NewElems(v, 0)
	first := true
	for e.Next() {
		ch := e.Value()
		if ch[0] != '{' {
			return false
		}
		if !first || !indexZero(ch) {
			c.OtherChoices = true
			continue
		}
		first = false
		if !c.choice(ch) {
			return false
		}
	}
	return e.End() >= 0
}

// indexZero reports whether a choice's index is 0 (or absent, which
// decodes as 0).
func indexZero(ch []byte) bool {
	m := jsonscan.NewMembers(ch, 0)
	zero := true
	for m.Next() {
		if m.Key().Equal("index") {
			v := m.Value()
			zero = null(v) || string(v) == "0"
		}
	}
	return zero
}

// choice reads the first choice.
func (c *Chunk) choice(ch []byte) bool {
	var text, content []byte
	hasContent := false
	m := jsonscan.NewMembers(ch, 0)
	for m.Next() {
		k, v := m.Key(), m.Value()
		switch {
		case k.Equal("text"):
			var ok bool
			if text, ok = strValue(v); !ok {
				return false
			}
		case k.Equal("finish_reason"):
			c.Finish = !null(v)
		case k.Equal("logprobs"):
			c.Logprobs = !null(v)
		case k.Equal("delta"):
			if null(v) {
				continue
			}
			if v[0] != '{' {
				return false
			}
			d := jsonscan.NewMembers(v, 0)
			for d.Next() {
				dk, dv := d.Key(), d.Value()
				switch {
				case dk.Equal("content"):
					var ok bool
					if content, ok = strValue(dv); !ok {
						return false
					}
					hasContent = content != nil
				case dk.Equal("role"):
					c.Role = !null(dv) && !bytes.Equal(dv, []byte(`""`))
				case dk.Equal("tool_calls"):
					c.ToolCalls = !null(dv)
				case dk.Equal("reasoning_content"):
					c.Reasoning = !null(dv) && !bytes.Equal(dv, []byte(`""`))
				}
			}
			if d.End() < 0 {
				return false
			}
		}
	}
	c.Text = text
	if hasContent {
		c.Text = content
	}
	return m.End() >= 0
}

// ReadUsage reads a usage object's counts. ok is false when v is not an
// object, names neither count, or a count is not a whole number (which
// reads as 0, as encoding/json leaves an int it cannot decode into).
func ReadUsage(v []byte) (u Usage, ok bool) {
	if len(v) == 0 || v[0] != '{' {
		return u, false
	}
	var prompt, completion, input, output []byte
	m := jsonscan.NewMembers(v, 0)
	for m.Next() {
		k, val := m.Key(), m.Value()
		switch {
		case k.Equal("prompt_tokens"):
			prompt = val
		case k.Equal("completion_tokens"):
			completion = val
		case k.Equal("input_tokens"):
			input = val
		case k.Equal("output_tokens"):
			output = val
		}
	}
	if m.End() < 0 {
		return u, false
	}
	var pok, cok bool
	u.PromptTokens, u.HasPrompt, pok = count(prompt, input)
	u.CompletionTokens, u.HasCompletion, cok = count(completion, output)
	return u, pok && cok && (u.HasPrompt || u.HasCompletion)
}

// count reads the first of two counts that is present (not absent, not
// null).
func count(a, b []byte) (n int, has, ok bool) {
	v := a
	if v == nil || null(v) {
		v = b
	}
	if v == nil || null(v) {
		return 0, false, true
	}
	n, err := strconv.Atoi(string(v))
	if err != nil {
		return 0, true, false
	}
	return n, true, true
}

// null reports whether a value is JSON's null.
func null(v []byte) bool { return string(v) == "null" }

// str checks that v is a string literal or null; it returns the literal.
func str(v []byte) ([]byte, bool) {
	if null(v) {
		return nil, true
	}
	return v, len(v) >= 2 && v[0] == '"'
}

// strValue is the value of a string literal, or nil for null; ok is false
// for any other value. The value is v's own bytes unless it holds an
// escape.
func strValue(v []byte) (s []byte, ok bool) {
	if null(v) {
		return nil, true
	}
	if len(v) < 2 || v[0] != '"' {
		return nil, false
	}
	if bytes.IndexByte(v, '\\') < 0 && utf8.Valid(v) {
		return v[1 : len(v)-1 : len(v)-1], true
	}
	// An escape, or bytes that are not UTF-8 (encoding/json makes each
	// U+FFFD): decoded as a client's decoder reads it.
	var str string
	if json.Unmarshal(v, &str) != nil {
		return nil, false
	}
	return []byte(str), true
}

// Member is one member Splice sets: Key's value becomes Value, or what
// Edit makes of the old one (Edit is not called for a member added).
type Member struct {
	Key   string
	Value []byte
	Edit  func(dst, old []byte) []byte
}

// Splice appends the object obj to dst with every top-level member named
// in set given its value, and the ones it lacks added before the closing
// brace (but an edited one); every other byte is obj's own. Every
// occurrence of a key is set, since a decoder keeps the last. ok is false
// when obj is not an object or set names more than eight keys.
func Splice(dst, obj []byte, set []Member) (out []byte, ok bool) {
	start := len(dst)
	var seen [8]bool
	if len(set) > len(seen) {
		return dst, false
	}
	at, members := 0, 0
	m := jsonscan.NewMembers(obj, jsonscan.SkipSpace(obj, 0))
	for m.Next() {
		members++
		k := m.Key()
		for i, sp := range set {
			if !k.Equal(sp.Key) {
				continue
			}
			from, to := m.Span()
			dst = append(dst, obj[at:from]...)
			if sp.Edit != nil {
				dst = sp.Edit(dst, obj[from:to])
			} else {
				dst = append(dst, sp.Value...)
			}
			at, seen[i] = to, true
			break
		}
	}
	end := m.End()
	if end < 0 {
		return dst[:start], false
	}
	closing := end - 1 // the '}'
	dst = append(dst, obj[at:closing]...)
	for i, sp := range set {
		if seen[i] || sp.Edit != nil {
			continue
		}
		if members > 0 {
			dst = append(dst, ',')
		}
		members++
		dst = strconv.AppendQuote(dst, sp.Key)
		dst = append(dst, ':')
		dst = append(dst, sp.Value...)
	}
	return append(dst, obj[closing:]...), true
}
