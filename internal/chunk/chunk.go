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
	// CachedTokens is how many of the prompt tokens the engine's prefix
	// cache served, when the object says (HasCached):
	// prompt_tokens_details or input_tokens_details.cached_tokens (vLLM,
	// OpenAI's Chat Completions and Responses APIs), a part of the
	// prompt count. (The Messages API's cache_read_input_tokens is not:
	// its input_tokens leaves the cache reads out.)
	CachedTokens int
	HasCached    bool
}

// Read reads data, one event's data. ok is false when data is not a JSON
// object or a member Read needs has a value of the wrong type; members it
// does not need are skipped, not checked. It reads the chunk once, front to
// back: the members it needs are descended into where they stand, the
// others skipped, so a key's name inside a value is never taken for a key.
func Read(data []byte) (c Chunk, ok bool) {
	r := reader{b: data}
	ok = r.members(func(k []byte) bool {
		switch string(k) {
		case "id":
			c.ID, ok = r.literal()
		case "model":
			c.Model, ok = r.literal()
		case "created":
			c.Created, ok = r.value()
		case "choices":
			ok = r.choices(&c)
		case "usage":
			v, vok := r.value()
			c.HasUsage, ok = false, vok
			if vok && !null(v) {
				c.Usage, ok = ReadUsage(v)
				c.HasUsage = ok
			}
		case "error":
			v, vok := r.value()
			c.Error, ok = !null(v), vok
		default:
			_, ok = r.value()
		}
		return ok
	})
	return c, ok && jsonscan.SkipSpace(data, r.i) == len(data)
}

// reader reads one chunk front to back; i is where it stands.
type reader struct {
	b []byte
	i int
}

// members walks the object at i: for each member it calls f with the
// key's name (unescaped) and i at the value, which f must read past.
func (r *reader) members(f func(name []byte) bool) bool {
	b := r.b
	i := jsonscan.SkipSpace(b, r.i)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	if i = jsonscan.SkipSpace(b, i+1); i < len(b) && b[i] == '}' {
		r.i = i + 1
		return true
	}
	var unescaped []byte
	for {
		if i >= len(b) || b[i] != '"' {
			return false
		}
		ke := jsonscan.StringEnd(b, i)
		if ke < 0 {
			return false
		}
		name := b[i+1 : ke-1]
		if bytes.IndexByte(name, '\\') >= 0 {
			unescaped = jsonscan.AppendString(unescaped[:0], b[i:ke])
			name = unescaped
		}
		if i = jsonscan.SkipSpace(b, ke); i >= len(b) || b[i] != ':' {
			return false
		}
		r.i = jsonscan.SkipSpace(b, i+1)
		if !f(name) {
			return false
		}
		var more, ok bool
		if i, more, ok = r.next('}'); !more {
			return ok
		}
	}
}

// next reads what follows a member or an element at i: a comma (more,
// with i at the next one) or the closing byte (r.i past it).
func (r *reader) next(closing byte) (i int, more, ok bool) {
	b := r.b
	if i = jsonscan.SkipSpace(b, r.i); i >= len(b) {
		return i, false, false
	}
	switch b[i] {
	case ',':
		return jsonscan.SkipSpace(b, i+1), true, true
	case closing:
		r.i = i + 1
		return i, false, true
	}
	return i, false, false
}

// value reads past the value at i and returns it.
func (r *reader) value() ([]byte, bool) {
	e := jsonscan.ValueEnd(r.b, r.i)
	if e < 0 {
		return nil, false
	}
	v := r.b[r.i:e]
	r.i = e
	return v, true
}

// literal reads a string literal or null: the literal, or nil.
func (r *reader) literal() ([]byte, bool) {
	v, ok := r.value()
	if !ok || null(v) {
		return nil, ok
	}
	return v, len(v) >= 2 && v[0] == '"'
}

// text reads a string or null: its value, or nil.
func (r *reader) text() ([]byte, bool) {
	v, ok := r.value()
	if !ok {
		return nil, false
	}
	return strValue(v)
}

// nonNull reads past a value and says whether it is anything but null
// (and, with empty set, anything but "").
func (r *reader) nonNull(empty bool) (bool, bool) {
	v, ok := r.value()
	return ok && !null(v) && !(empty && string(v) == `""`), ok
}

// choices reads the choices array: the first choice at index 0, and
// whether there are others.
func (r *reader) choices(c *Chunk) bool {
	b := r.b
	i := r.i
	if i >= len(b) {
		return false
	}
	if b[i] == 'n' {
		_, ok := r.value()
		return ok
	}
	if b[i] != '[' {
		return false
	}
	if i = jsonscan.SkipSpace(b, i+1); i < len(b) && b[i] == ']' {
		r.i = i + 1
		return true
	}
	c.Text, c.Role, c.Finish, c.Logprobs, c.ToolCalls, c.Reasoning, c.OtherChoices = nil, false, false, false, false, false, false
	first := true
	for {
		r.i = i
		ch := choice{index0: true}
		if !r.members(func(k []byte) bool { return r.choiceMember(k, &ch) }) {
			return false
		}
		if first && ch.index0 {
			first = false
			c.Text = ch.text
			if ch.content != nil {
				c.Text = ch.content
			}
			c.Role, c.Finish, c.Logprobs, c.ToolCalls, c.Reasoning = ch.role, ch.finish, ch.logprobs, ch.toolCalls, ch.reasoning
		} else {
			c.OtherChoices = true
		}
		var more, ok bool
		if i, more, ok = r.next(']'); !more {
			return ok
		}
	}
}

// choice is what Read takes of one choice, its delta's members included.
type choice struct {
	text, content                                        []byte
	index0, role, finish, logprobs, toolCalls, reasoning bool
}

// choiceMember reads one member of a choice into ch; the last of
// duplicates wins, as a decoder has it.
func (r *reader) choiceMember(k []byte, ch *choice) (ok bool) {
	switch string(k) {
	case "index":
		var v []byte
		v, ok = r.value()
		ch.index0 = null(v) || string(v) == "0"
	case "text":
		ch.text, ok = r.text()
	case "finish_reason":
		ch.finish, ok = r.nonNull(false)
	case "logprobs":
		ch.logprobs, ok = r.nonNull(false)
	case "delta":
		ch.content, ch.role, ch.toolCalls, ch.reasoning = nil, false, false, false
		if r.i < len(r.b) && r.b[r.i] == 'n' {
			_, ok = r.value()
			return ok
		}
		return r.members(func(k []byte) (ok bool) {
			switch string(k) {
			case "content":
				ch.content, ok = r.text()
			case "role":
				ch.role, ok = r.nonNull(true)
			case "tool_calls":
				ch.toolCalls, ok = r.nonNull(false)
			case "reasoning_content":
				ch.reasoning, ok = r.nonNull(true)
			default:
				_, ok = r.value()
			}
			return ok
		})
	default:
		_, ok = r.value()
	}
	return ok
}

// ReadUsage reads a usage object's counts. ok is false when v is not an
// object, names neither count, or a count is not a whole number (which
// reads as 0, as encoding/json leaves an int it cannot decode into).
func ReadUsage(v []byte) (u Usage, ok bool) {
	if len(v) == 0 || v[0] != '{' {
		return u, false
	}
	var prompt, completion, input, output, cached []byte
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
		case k.Equal("prompt_tokens_details"), k.Equal("input_tokens_details"):
			if cached == nil {
				cached = cachedIn(val)
			}
		}
	}
	if m.End() < 0 {
		return u, false
	}
	var pok, cok bool
	u.PromptTokens, u.HasPrompt, pok = count(prompt, input)
	u.CompletionTokens, u.HasCompletion, cok = count(completion, output)
	// A cached count that is not a whole number in [0, prompt] is not
	// believed, and costs the usage nothing.
	if n, has, ok := count(cached, nil); has && ok && n >= 0 && (!u.HasPrompt || n <= u.PromptTokens) {
		u.CachedTokens, u.HasCached = n, true
	}
	return u, pok && cok && (u.HasPrompt || u.HasCompletion)
}

// cachedIn is the cached_tokens member of a details object, nil when v is
// not an object or does not name it.
func cachedIn(v []byte) []byte {
	if len(v) == 0 || v[0] != '{' {
		return nil
	}
	var cached []byte
	m := jsonscan.NewMembers(v, 0)
	for m.Next() {
		if m.Key().Equal("cached_tokens") {
			cached = m.Value()
		}
	}
	if m.End() < 0 {
		return nil
	}
	return cached
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
