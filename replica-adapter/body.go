package adapter

import (
	"bytes"
	"encoding/json"
	"errors"
)

var errBadJSON = errors.New("request body is not a JSON object")

// rewriteModel returns body with its top-level "model" set to name. It
// rewrites only that value's bytes: the rest of the body, which can be
// megabytes of prompt, is copied, never decoded. Every top-level "model" is
// rewritten (a JSON decoder keeps the last of duplicate keys, so they must all
// agree), and a body without one gets it. The body is returned unchanged when
// it already names the model.
func rewriteModel(body []byte, name string) ([]byte, error) {
	spans, end, err := modelSpans(body)
	if err != nil {
		return nil, err
	}
	quoted, _ := json.Marshal(name) // a string always marshals
	if len(spans) == 0 {
		// Insert before the closing brace; an empty object takes no comma.
		out := make([]byte, 0, len(body)+len(quoted)+10)
		out = append(out, body[:end]...)
		if t := bytes.TrimSpace(body[:end]); t[len(t)-1] != '{' {
			out = append(out, ',')
		}
		out = append(out, `"model":`...)
		out = append(out, quoted...)
		return append(out, body[end:]...), nil
	}
	same := true
	for _, s := range spans {
		if !bytes.Equal(body[s[0]:s[1]], quoted) {
			same = false
		}
	}
	if same {
		return body, nil
	}
	out := make([]byte, 0, len(body)+len(quoted))
	prev := 0
	for _, s := range spans {
		out = append(out, body[prev:s[0]]...)
		out = append(out, quoted...)
		prev = s[1]
	}
	return append(out, body[prev:]...), nil
}

// modelSpans scans a JSON object and returns the byte spans of the values of
// its top-level "model" keys, and the offset of its closing brace.
func modelSpans(b []byte) (spans [][2]int, end int, err error) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, 0, errBadJSON
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return nil, i, checkTail(b, i+1)
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return nil, 0, errBadJSON
		}
		keyEnd, err := skipString(b, i)
		if err != nil {
			return nil, 0, err
		}
		isModel := keyIs(b[i:keyEnd], "model")
		i = skipSpace(b, keyEnd)
		if i >= len(b) || b[i] != ':' {
			return nil, 0, errBadJSON
		}
		i = skipSpace(b, i+1)
		valEnd, err := skipValue(b, i)
		if err != nil {
			return nil, 0, err
		}
		if isModel {
			spans = append(spans, [2]int{i, valEnd})
		}
		i = skipSpace(b, valEnd)
		if i >= len(b) {
			return nil, 0, errBadJSON
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return spans, i, checkTail(b, i+1)
		default:
			return nil, 0, errBadJSON
		}
	}
}

// keyIs compares a quoted key with want, unescaping only when the key holds
// an escape ("mod\u0065l" is "model" too).
func keyIs(quoted []byte, want string) bool {
	if bytes.IndexByte(quoted, '\\') < 0 {
		return string(quoted[1:len(quoted)-1]) == want
	}
	var s string
	return json.Unmarshal(quoted, &s) == nil && s == want
}

func checkTail(b []byte, i int) error {
	if skipSpace(b, i) != len(b) {
		return errBadJSON
	}
	return nil
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the offset just past the string starting at b[i] ==
// '"': the first quote after it not preceded by an odd run of backslashes.
// It jumps from quote to quote with bytes.IndexByte, so a long prompt costs
// a memory scan, not a loop over its bytes.
func skipString(b []byte, i int) (int, error) {
	for j := i + 1; ; {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return 0, errBadJSON
		}
		q := j + k
		n := 0
		for p := q - 1; p > i && b[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return q + 1, nil
		}
		j = q + 1
	}
}

// skipValue returns the offset just past the value starting at b[i]. Nested
// objects and arrays are skipped by depth, minding strings; scalars end at
// the next delimiter. Values are not validated beyond that: the engine parses
// the body and answers 400 for what is malformed.
func skipValue(b []byte, i int) (int, error) {
	if i >= len(b) {
		return 0, errBadJSON
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				e, err := skipString(b, j)
				if err != nil {
					return 0, err
				}
				j = e - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1, nil
				}
			}
		}
		return 0, errBadJSON
	}
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
		j++
	}
	if j == i {
		return 0, errBadJSON
	}
	return j, nil
}
