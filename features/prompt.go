package features

import (
	"encoding/binary"
	"encoding/json"
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
// array renders the same way).
func appendMessages(dst []byte, raw json.RawMessage) ([]byte, error) {
	return appendItems(dst, "messages", raw, false)
}

// appendItems renders an array of messages named param. With lenient (the
// Responses API's input items), items without a role, such as tool calls
// and their outputs, contribute nothing.
func appendItems(dst []byte, param string, raw json.RawMessage, lenient bool) ([]byte, error) {
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
			return dst, perr(index(param, i), "must be a message object")
		}
		if lenient && !present(msg.Role) {
			continue
		}
		if !isString(msg.Role) || len(msg.Role) == 2 {
			return dst, perr(index(param, i)+".role", "must be a non-empty string")
		}
		dst = appendJSONString(dst, msg.Role)
		dst = append(dst, '\n')
		var err error
		if dst, err = appendContent(dst, index(param, i)+".content", msg.Content); err != nil {
			return dst, err
		}
		dst = append(dst, '\n')
	}
	return dst, nil
}

// index renders a param such as "messages[3]"; only built for an error.
func index(param string, i int) string { return param + "[" + strconv.Itoa(i) + "]" }

// appendContent renders the content of message msg: a string, an array of
// content parts, or null/absent (an assistant message with only tool calls).
func appendContent(dst []byte, param string, raw json.RawMessage) ([]byte, error) {
	switch {
	case !present(raw):
		return dst, nil
	case isString(raw):
		return appendJSONString(dst, raw), nil
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
			return dst, perr(index(param, j), "must be a content part object")
		}
		if !isString(part.Type) {
			return dst, perr(index(param, j)+".type", "must be a string")
		}
		switch string(part.Type) {
		case `"text"`, `"input_text"`, `"output_text"`: // chat and Anthropic; the Responses API
		default:
			continue
		}
		if !isString(part.Text) {
			return dst, perr(index(param, j)+".text", "must be a string")
		}
		dst = appendJSONString(dst, part.Text)
	}
	return dst, nil
}

// appendPromptField renders a completions prompt or an embeddings input: a
// string, an array of strings, an array of token ids, or an array of arrays
// of token ids. exact is the token count when ids were given, else -1.
func appendPromptField(dst []byte, param string, raw json.RawMessage) (out []byte, exact int, err error) {
	if isString(raw) {
		return appendJSONString(dst, raw), -1, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return dst, -1, perr(param, "must be a string, an array of strings or an array of token ids")
	}
	if len(items) == 0 {
		return dst, -1, perr(param, "must not be empty")
	}
	if isString(items[0]) {
		for i, it := range items {
			if !isString(it) {
				return dst, -1, perr(index(param, i), "must be a string like the other items")
			}
			if i > 0 {
				dst = append(dst, '\n')
			}
			dst = appendJSONString(dst, it)
		}
		return dst, -1, nil
	}
	if len(items[0]) > 0 && items[0][0] == '[' {
		n := 0
		for i, it := range items {
			var ids []json.RawMessage
			if err := json.Unmarshal(it, &ids); err != nil || len(ids) == 0 {
				return dst, -1, perr(index(param, i), "must be a non-empty array of token ids")
			}
			if dst, err = appendTokenIDs(dst, index(param, i), ids); err != nil {
				return dst, -1, err
			}
			n += len(ids)
		}
		return dst, n, nil
	}
	dst, err = appendTokenIDs(dst, param, items)
	return dst, len(items), err
}

func appendTokenIDs(dst []byte, param string, ids []json.RawMessage) ([]byte, error) {
	for i, id := range ids {
		v, err := strconv.ParseUint(string(id), 10, 32)
		if err != nil {
			return dst, perr(index(param, i), "must be a token id (an integer from 0 to 4294967295)")
		}
		dst = binary.LittleEndian.AppendUint32(dst, uint32(v))
	}
	return dst, nil
}

func isString(raw json.RawMessage) bool { return len(raw) >= 2 && raw[0] == '"' }

// appendJSONString appends the decoded value of a JSON string literal that
// encoding/json has already validated, without an intermediate string. It
// decodes exactly as encoding/json does, lone surrogates becoming U+FFFD.
func appendJSONString(dst []byte, lit []byte) []byte {
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
