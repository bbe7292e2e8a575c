package features

import (
	"encoding/binary"
	"strconv"

	"github.com/switchyard-llm/switchyard/internal/jsonscan"
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
	e := jsonscan.NewElems(raw, 0)
	for i := 0; ; i++ {
		if !e.Next() {
			if i == 0 {
				return dst, perr(param, "must not be empty")
			}
			return dst, nil
		}
		m := e.Value()
		var role, content []byte
		switch m[0] {
		case '{':
			role, content = jsonscan.Lookup2Fold(m, "role", "content")
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
		dst = jsonscan.AppendString(dst, role)
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
		return jsonscan.AppendString(dst, raw), nil
	case raw[0] != '[':
		return dst, perr(param, "must be a string or an array of content parts")
	}
	e := jsonscan.NewElems(raw, 0)
	for j := 0; e.Next(); j++ {
		pr := e.Value()
		var typ, text []byte
		switch pr[0] {
		case '{':
			typ, text = jsonscan.Lookup2Fold(pr, "type", "text")
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
		dst = jsonscan.AppendString(dst, text)
	}
	return dst, nil
}

// appendPromptField renders a completions prompt or an embeddings input: a
// string, an array of strings, an array of token ids, or an array of arrays
// of token ids. exact is the token count when ids were given, else -1.
func appendPromptField(dst []byte, param string, raw []byte) (out []byte, exact int, err error) {
	if isString(raw) {
		return jsonscan.AppendString(dst, raw), -1, nil
	}
	if raw[0] != '[' {
		return dst, -1, perr(param, "must be a string, an array of strings or an array of token ids")
	}
	e := jsonscan.NewElems(raw, 0)
	if !e.Next() {
		return dst, -1, perr(param, "must not be empty")
	}
	first := e.Value()
	e = jsonscan.NewElems(raw, 0)
	switch {
	case isString(first):
		for i := 0; e.Next(); i++ {
			it := e.Value()
			if !isString(it) {
				return dst, -1, perr(index(param, i), "must be a string like the other items")
			}
			if i > 0 {
				dst = append(dst, '\n')
			}
			dst = jsonscan.AppendString(dst, it)
		}
		return dst, -1, nil
	case first[0] == '[':
		n := 0
		for i := 0; e.Next(); i++ {
			it := e.Value()
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
		return dst, n, nil
	}
	dst, n, err := appendTokenIDs(dst, param, raw)
	return dst, n, err
}

// appendTokenIDs renders a valid array of token ids, returning how many.
func appendTokenIDs(dst []byte, param string, arr []byte) ([]byte, int, error) {
	e := jsonscan.NewElems(arr, 0)
	i := 0
	for ; e.Next(); i++ {
		v, ok := tokenID(e.Value())
		if !ok {
			return dst, i, perr(index(param, i), "must be a token id (an integer from 0 to 4294967295)")
		}
		dst = binary.LittleEndian.AppendUint32(dst, v)
	}
	return dst, i, nil
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
