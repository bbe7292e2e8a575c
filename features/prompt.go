package features

import (
	"bytes"
	"encoding/binary"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// The canonical prompt is what prefix hashes, token estimates, code detection
// and regex cascade rules see. Equal conversations render to equal bytes:
//
//	chat:         for each message in order: role "\n" content "\n", where an
//	              array content is its text parts concatenated (other parts,
//	              such as images, contribute nothing)
//	completions:  the prompt; an array of strings joined with "\n"
//	token ids:    each id as 4 little-endian bytes, so a prefix block of
//	              prefix_block_chars bytes always holds whole tokens
//	embeddings:   input, rendered like a completions prompt

// appendMessages renders a chat messages array (an Anthropic messages
// array renders the same way); raw is a valid JSON value.
func appendMessages(dst []byte, raw []byte) ([]byte, error) {
	return appendItems(dst, "messages", raw, false)
}

// appendItems renders an array of messages named param. With lenient (the
// Responses API's input items), items without a role, such as tool calls
// and their outputs, contribute nothing.
func appendItems(dst []byte, param string, raw []byte, lenient bool) ([]byte, error) {
	if raw[0] != '[' {
		return dst, perr(param, "must be an array of message objects")
	}
	e := newElems(raw)
	for i := 0; ; i++ {
		m, ok := e.next()
		if !ok {
			if i == 0 {
				return dst, perr(param, "must not be empty")
			}
			return dst, nil
		}
		var role, content []byte
		switch m[0] {
		case '{':
			role, content = lookup2(m, "role", "content")
		case 'n': // null decodes to an empty message
		default:
			return dst, perr(index(param, i), "must be a message object")
		}
		if lenient && !present(role) {
			continue
		}
		if !isString(role) || len(role) == 2 {
			return dst, perr(index(param, i)+".role", "must be a non-empty string")
		}
		dst = appendJSONString(dst, role)
		dst = append(dst, '\n')
		var err error
		if dst, err = appendContent(dst, index(param, i)+".content", content); err != nil {
			return dst, err
		}
		dst = append(dst, '\n')
	}
}

// index renders a param such as "messages[3]"; only built for an error.
func index(param string, i int) string { return param + "[" + strconv.Itoa(i) + "]" }

// appendContent renders the content of message msg: a string, an array of
// content parts, or null/absent (an assistant message with only tool calls).
func appendContent(dst []byte, param string, raw []byte) ([]byte, error) {
	switch {
	case !present(raw):
		return dst, nil
	case isString(raw):
		return appendJSONString(dst, raw), nil
	case raw[0] != '[':
		return dst, perr(param, "must be a string or an array of content parts")
	}
	e := newElems(raw)
	for j := 0; ; j++ {
		pr, ok := e.next()
		if !ok {
			return dst, nil
		}
		var typ, text []byte
		switch pr[0] {
		case '{':
			typ, text = lookup2(pr, "type", "text")
		case 'n':
		default:
			return dst, perr(index(param, j), "must be a content part object")
		}
		if !isString(typ) {
			return dst, perr(index(param, j)+".type", "must be a string")
		}
		switch string(typ) {
		case `"text"`, `"input_text"`, `"output_text"`: // chat and Anthropic; the Responses API
		default:
			continue
		}
		if !isString(text) {
			return dst, perr(index(param, j)+".text", "must be a string")
		}
		dst = appendJSONString(dst, text)
	}
}

// appendPromptField renders a completions prompt or an embeddings input: a
// string, an array of strings, an array of token ids, or an array of arrays
// of token ids. exact is the token count when ids were given, else -1.
func appendPromptField(dst []byte, param string, raw []byte) (out []byte, exact int, err error) {
	if isString(raw) {
		return appendJSONString(dst, raw), -1, nil
	}
	if raw[0] != '[' {
		return dst, -1, perr(param, "must be a string, an array of strings or an array of token ids")
	}
	e := newElems(raw)
	first, ok := e.next()
	if !ok {
		return dst, -1, perr(param, "must not be empty")
	}
	e = newElems(raw)
	switch {
	case isString(first):
		for i := 0; ; i++ {
			it, ok := e.next()
			if !ok {
				return dst, -1, nil
			}
			if !isString(it) {
				return dst, -1, perr(index(param, i), "must be a string like the other items")
			}
			if i > 0 {
				dst = append(dst, '\n')
			}
			dst = appendJSONString(dst, it)
		}
	case first[0] == '[':
		n := 0
		for i := 0; ; i++ {
			it, ok := e.next()
			if !ok {
				return dst, n, nil
			}
			k := 0 // anything but an array (null included) is an empty batch
			if it[0] == '[' {
				if dst, k, err = appendTokenIDs(dst, index(param, i), it); err != nil {
					return dst, -1, err
				}
			}
			if k == 0 {
				return dst, -1, perr(index(param, i), "must be a non-empty array of token ids")
			}
			n += k
		}
	}
	dst, n, err := appendTokenIDs(dst, param, raw)
	return dst, n, err
}

// appendTokenIDs renders a valid array of token ids, returning how many.
func appendTokenIDs(dst []byte, param string, arr []byte) ([]byte, int, error) {
	e := newElems(arr)
	for i := 0; ; i++ {
		id, ok := e.next()
		if !ok {
			return dst, i, nil
		}
		v, ok := tokenID(id)
		if !ok {
			return dst, i, perr(index(param, i), "must be a token id (an integer from 0 to 4294967295)")
		}
		dst = binary.LittleEndian.AppendUint32(dst, v)
	}
}

// tokenID parses what strconv.ParseUint(s, 10, 32) accepts of a JSON value:
// decimal digits only (JSON has no leading "+" and no leading zeros but 0).
func tokenID(b []byte) (uint32, bool) {
	if len(b) == 0 || len(b) > 10 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	if v > 1<<32-1 {
		return 0, false
	}
	return uint32(v), true
}

func isString(raw []byte) bool { return len(raw) >= 2 && raw[0] == '"' }

// appendJSONString appends the decoded value of a JSON string literal that
// the scanner has already validated, without an intermediate string. It
// decodes exactly as encoding/json does, lone surrogates becoming U+FFFD.
func appendJSONString(dst []byte, lit []byte) []byte {
	s := lit[1 : len(lit)-1]
	for i := 0; i < len(s); {
		c := s[i]
		if c != '\\' {
			j := bytes.IndexByte(s[i:], '\\')
			if j < 0 {
				return append(dst, s[i:]...)
			}
			dst = append(dst, s[i:i+j]...)
			i += j
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
			r := hex4(s[i+2:])
			i += 6
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
					r2 = hex4(s[i+2:])
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

func hex4(b []byte) rune {
	if len(b) < 4 {
		return utf8.RuneError
	}
	var r rune
	for _, c := range b[:4] {
		v, ok := hexDigit(c)
		if !ok {
			return utf8.RuneError
		}
		r = r<<4 | rune(v)
	}
	return r
}
