package adapter

import (
	"bytes"
	"encoding/json"
	"errors"
)

var errBadJSON = errors.New("request body is not a JSON object")

// bodyField is a top-level setting the adapter writes into the body it
// sends the engine: every top-level occurrence of any of its keys gets value
// (a JSON decoder keeps the last of duplicate keys, so they must all agree),
// and a body with none of them gets keys[0].
type bodyField struct {
	keys  []string
	value []byte // JSON
}

// setFields returns body with fields set, and the values of the top-level
// keys named in watch (read, not changed), in one pass over the body. It
// rewrites only the set values' bytes: the rest of the body, which can be
// megabytes of prompt, is copied, never decoded. The body is returned
// unchanged when it already holds every value.
func setFields(body []byte, fields []bodyField, watch ...string) ([]byte, [][]byte, error) {
	keys := make([]string, 0, 2*len(fields)+len(watch))
	owner := make([]int, 0, cap(keys))
	for i, f := range fields {
		for _, k := range f.keys {
			keys, owner = append(keys, k), append(owner, i)
		}
	}
	for _, k := range watch {
		keys, owner = append(keys, k), append(owner, -1)
	}
	spans, end, err := topLevel(body, keys)
	if err != nil {
		return nil, nil, err
	}
	var watched [][]byte
	found := make([]bool, len(fields))
	same := true
	n := 0
	for _, s := range spans {
		i := owner[s.key]
		if i < 0 {
			watched = append(watched, body[s.from:s.to])
			continue
		}
		spans[n] = s
		n++
		found[i] = true
		if !bytes.Equal(body[s.from:s.to], fields[i].value) {
			same = false
		}
	}
	spans = spans[:n]
	var missing []bodyField
	for i, f := range fields {
		if !found[i] {
			missing = append(missing, f)
		}
	}
	if same && len(missing) == 0 {
		return body, watched, nil
	}
	out := make([]byte, 0, len(body)+64)
	prev := 0
	for _, s := range spans {
		out = append(out, body[prev:s.from]...)
		out = append(out, fields[owner[s.key]].value...)
		prev = s.to
	}
	out = append(out, body[prev:end]...)
	// Insert before the closing brace; an empty object takes no comma.
	empty := bytes.TrimSpace(body[:end])
	comma := empty[len(empty)-1] != '{'
	for _, f := range missing {
		if comma {
			out = append(out, ',')
		}
		comma = true
		q, _ := json.Marshal(f.keys[0])
		out = append(out, q...)
		out = append(out, ':')
		out = append(out, f.value...)
	}
	return append(out, body[end:]...), watched, nil
}

// span is the value of a top-level key: keys[key] at body[from:to].
type span struct{ key, from, to int }

// topLevel scans a JSON object and returns the byte spans of the values of
// its top-level keys named in keys, and the offset of its closing brace.
func topLevel(b []byte, keys []string) (spans []span, end int, err error) {
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
		which := -1
		for k, want := range keys {
			if keyIs(b[i:keyEnd], want) {
				which = k
				break
			}
		}
		i = skipSpace(b, keyEnd)
		if i >= len(b) || b[i] != ':' {
			return nil, 0, errBadJSON
		}
		i = skipSpace(b, i+1)
		valEnd, err := skipValue(b, i)
		if err != nil {
			return nil, 0, err
		}
		if which >= 0 {
			spans = append(spans, span{which, i, valEnd})
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

// quote quotes s as a JSON string (a string always marshals).
func quote(s string) ([]byte, error) { return json.Marshal(s) }
