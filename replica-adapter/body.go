package adapter

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"

	"github.com/switchyard-llm/switchyard/internal/jsonscan"
)

var errBadJSON = errors.New("request body is not a JSON object")

// bodyField is a top-level setting the adapter writes into the body it
// sends the engine: every top-level occurrence of any of its keys gets value
// (a JSON decoder keeps the last of duplicate keys, so they must all agree),
// and a body with none of them gets keys[0], unless the field only
// replaces.
type bodyField struct {
	keys     []string
	value    []byte // JSON
	replaces bool   // set only where the body has it: nothing added
}

// setFields returns body with fields set, and the values of the top-level
// keys named in watch (read, not changed), in one pass over the body: the
// parts of setParts joined.
func setFields(body []byte, fields []bodyField, watch ...string) ([]byte, [][]byte, error) {
	parts, watched, err := setParts(body, fields, watch...)
	if err != nil {
		return nil, nil, err
	}
	if len(parts) == 1 {
		return parts[0], watched, nil
	}
	return bytes.Join(parts, nil), watched, nil
}

// setParts returns body with fields set as the parts that, written in
// order, make it, and the values of the top-level keys named in watch
// (read, not changed), in one pass over the body. Only the set values are
// new bytes: the rest of the body, which can be megabytes of prompt, is
// parts of body itself, never decoded nor copied. The body is the one part
// when it already holds every value.
func setParts(body []byte, fields []bodyField, watch ...string) (net.Buffers, [][]byte, error) {
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
		if !found[i] && !f.replaces {
			missing = append(missing, f)
		}
	}
	if same && len(missing) == 0 {
		return net.Buffers{body}, watched, nil
	}
	parts := make(net.Buffers, 0, 2*len(spans)+3)
	prev := 0
	for _, s := range spans {
		parts = append(parts, body[prev:s.from], fields[owner[s.key]].value)
		prev = s.to
	}
	parts = append(parts, body[prev:end])
	// Insert before the closing brace; an empty object takes no comma.
	empty := bytes.TrimSpace(body[:end])
	comma := empty[len(empty)-1] != '{'
	var added []byte
	for _, f := range missing {
		if comma {
			added = append(added, ',')
		}
		comma = true
		q, _ := json.Marshal(f.keys[0])
		added = append(added, q...)
		added = append(added, ':')
		added = append(added, f.value...)
	}
	return append(parts, added, body[end:]), watched, nil
}

// span is the value of a top-level key: keys[key] at body[from:to].
type span struct{ key, from, to int }

// topLevel reads a JSON object's punctuation and returns the byte spans of
// the values of its top-level keys named in keys, and the offset of its
// closing brace. Keys match exactly once unescaped, as the engine's JSON
// decoder reads them. Values are not validated beyond finding their ends:
// the engine parses the body and answers 400 for what is malformed.
func topLevel(b []byte, keys []string) (spans []span, end int, err error) {
	m := jsonscan.NewMembers(b, jsonscan.SkipSpace(b, 0))
	for m.Next() {
		k := m.Key()
		for which, want := range keys {
			if k.Equal(want) {
				from, to := m.Span()
				spans = append(spans, span{which, from, to})
				break
			}
		}
	}
	end = m.End()
	if end < 0 || jsonscan.SkipSpace(b, end) != len(b) {
		return nil, 0, errBadJSON
	}
	return spans, end - 1, nil
}

// quote quotes s as a JSON string (a string always marshals).
func quote(s string) ([]byte, error) { return json.Marshal(s) }

// joinBelow is the body length up to which the engine's body is joined
// into one buffer: net/http writes the headers and a body it knows to be
// in memory (a bytes.Reader) together, and any other body after flushing
// the headers alone, a write more. The bound is chosen, not measured: at
// 32 KiB both the copy and the write are a few microseconds, and past it
// the copy grows with the body while the write does not.
const joinBelow = 32 << 10

// partsReader reads parts in order without consuming the caller's slice
// of them (a net.Buffers is consumed as it is read).
func partsReader(parts net.Buffers) *net.Buffers {
	r := append(net.Buffers(nil), parts...)
	return &r
}

// partsLen is the length of the body parts make.
func partsLen(parts net.Buffers) int64 {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	return int64(n)
}
