package jsonscan

import "bytes"

// The skippers check punctuation only. Every offset they return is within
// the input, and -1 (or a false Next) says the input ended first or broke
// the punctuation they read; what lies inside a value (an escape, a number,
// the nesting of brackets) is left to whoever parses it next, or to
// Validate before them.

// SkipSpace returns the offset of the first non-blank byte at or after i,
// or len(b).
func SkipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// StringEnd returns the offset just past the string starting at b[i] ==
// '"': the first quote after it not preceded by an odd run of backslashes,
// or -1 when there is none. It jumps from quote to quote with
// bytes.IndexByte, so a long prompt costs a memory scan, not a loop over its
// bytes.
func StringEnd(b []byte, i int) int {
	for j := i + 1; ; {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return -1
		}
		q := j + k
		n := 0
		for p := q - 1; p > i && b[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return q + 1
		}
		j = q + 1
	}
}

// ValueEnd returns the offset just past the value starting at b[i], or -1.
// An object or array ends where its brackets balance, strings minded; a
// scalar ends at the next delimiter or blank and must not be empty.
func ValueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return StringEnd(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				e := StringEnd(b, j)
				if e < 0 {
					return -1
				}
				j = e - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
		j++
	}
	if j == i {
		return -1
	}
	return j
}

// Members walks the members of an object: each key must be a string
// followed by a colon, members are separated by commas and the object ends
// with '}'; each value is read as far as ValueEnd reads it.
//
//	m := jsonscan.NewMembers(b, i)
//	for m.Next() {
//		use(m.Key(), m.Value())
//	}
//	if m.End() < 0 {
//		// malformed
//	}
type Members struct {
	c        container
	key, kto int
}

// NewMembers walks the object starting at b[i], which should be '{'.
func NewMembers(b []byte, i int) Members {
	return Members{c: container{b: b, i: i, end: -1}}
}

// Next reads the next member; false after the last, or on malformed input.
func (m *Members) Next() bool {
	c := &m.c
	i, ok := c.i, false
	switch c.state {
	case walking:
		if i, ok = c.next('}'); !ok {
			return false
		}
	case unopened:
		if i, ok = c.open('{', '}'); !ok {
			return false
		}
	default:
		return false
	}
	if c.b[i] != '"' {
		return c.fail()
	}
	ke := StringEnd(c.b, i)
	if ke < 0 {
		return c.fail()
	}
	v := SkipSpace(c.b, ke)
	if v >= len(c.b) || c.b[v] != ':' {
		return c.fail()
	}
	v = SkipSpace(c.b, v+1)
	end := ValueEnd(c.b, v)
	if end < 0 {
		return c.fail()
	}
	c.from, c.i = v, end
	m.key, m.kto = i, ke
	return true
}

// Key is the current member's key.
func (m *Members) Key() Key { return keyOf(m.c.b[m.key:m.kto]) }

// Value is the current member's value.
func (m *Members) Value() []byte { return m.c.b[m.c.from:m.c.i] }

// Span is where the current member's value lies: b[from:to].
func (m *Members) Span() (from, to int) { return m.c.from, m.c.i }

// End is the offset just past the closing brace once Next has returned
// false, or -1 when the object was malformed or cut short.
func (m *Members) End() int { return m.c.end }

// Elems walks the elements of an array as Members walks an object's
// members.
type Elems struct{ c container }

// NewElems walks the array starting at b[i], which should be '['.
func NewElems(b []byte, i int) Elems {
	return Elems{c: container{b: b, i: i, end: -1}}
}

// Next reads the next element; false after the last, or on malformed input.
func (e *Elems) Next() bool {
	c := &e.c
	i, ok := c.i, false
	switch c.state {
	case walking:
		if i, ok = c.next(']'); !ok {
			return false
		}
	case unopened:
		if i, ok = c.open('[', ']'); !ok {
			return false
		}
	default:
		return false
	}
	end := ValueEnd(c.b, i)
	if end < 0 {
		return c.fail()
	}
	c.from, c.i = i, end
	return true
}

// Value is the current element.
func (e *Elems) Value() []byte { return e.c.b[e.c.from:e.c.i] }

// End is the offset just past the closing bracket once Next has returned
// false, or -1 when the array was malformed or cut short.
func (e *Elems) End() int { return e.c.end }

// container is the walk Members and Elems share.
type container struct {
	b     []byte
	i     int // the opening byte, then the end of the current value
	from  int // the current value is b[from:i]
	end   int
	state uint8
}

const (
	unopened = iota
	walking
	ended
)

// open reads past the opening byte to the first item. ok is false for an
// empty container (end is then set) and on malformed input.
func (c *container) open(opening, closing byte) (i int, ok bool) {
	i = c.i
	if i >= len(c.b) || c.b[i] != opening {
		return 0, c.fail()
	}
	if i = SkipSpace(c.b, i+1); i >= len(c.b) {
		return 0, c.fail()
	}
	if c.b[i] == closing {
		c.state, c.end = ended, i+1
		return 0, false
	}
	c.state = walking
	return i, true
}

// next reads past the comma after an item to the next one. ok is false
// at the closing byte (end is then set) and on malformed input.
func (c *container) next(closing byte) (i int, ok bool) {
	i = SkipSpace(c.b, c.i)
	if i >= len(c.b) {
		return 0, c.fail()
	}
	switch c.b[i] {
	case ',':
		if i = SkipSpace(c.b, i+1); i < len(c.b) {
			return i, true
		}
	case closing:
		c.state, c.end = ended, i+1
		return 0, false
	}
	return 0, c.fail()
}

func (c *container) fail() bool {
	c.state, c.end = ended, -1
	return false
}

// Lookup2Fold returns the values of the members named a and b of an object
// (the last of duplicates), matching keys with Key.EqualFold as
// encoding/json does.
func Lookup2Fold(obj []byte, a, b string) (va, vb []byte) {
	m := NewMembers(obj, 0)
	for m.Next() {
		k := m.Key()
		switch {
		case k.EqualFold(a):
			va = m.Value()
		case k.EqualFold(b):
			vb = m.Value()
		}
	}
	return va, vb
}

// NextMember finds the first member whose key starts at or after offset i
// of b, a window of JSON at any depth that need not be whole or parsed: it
// reads strings whole, quote to quote, and a string followed (blanks
// allowed) by a colon is a key, so neither a key's name inside a string
// value nor a string value passes for a key. It returns the key's literal,
// quotes included, and the offset of its value. key is nil when no member
// follows: value is then len(b), or -1 when b ends inside a string or right
// after a key's colon.
func NextMember(b []byte, i int) (key []byte, value int) {
	for {
		q := bytes.IndexByte(b[i:], '"')
		if q < 0 {
			return nil, len(b)
		}
		k := i + q
		end := StringEnd(b, k)
		if end < 0 {
			return nil, -1
		}
		if i = SkipSpace(b, end); i >= len(b) || b[i] != ':' {
			continue // a string value
		}
		if v := SkipSpace(b, i+1); v < len(b) {
			return b[k:end], v
		}
		return nil, -1
	}
}

// LastMember returns the last member keyed quoted (a string literal such as
// `"usage"`) whose key ends at or before offset before: the offsets of its
// key and of its value, found by searching for the literal followed, blanks
// allowed, by a colon; -1 and -1 when there is none. It reads windows that
// may be cut from a larger body or not yet parsed: the literal cannot match
// inside a string value, whose quotes are escaped, and a string value equal
// to it is not followed by a colon.
func LastMember(b []byte, quoted string, before int) (key, value int) {
	for end := before; ; {
		k := bytes.LastIndex(b[:end], []byte(quoted))
		if k < 0 {
			return -1, -1
		}
		if v := afterColon(b, k+len(quoted)); v >= 0 {
			return k, v
		}
		end = k
	}
}

// afterColon returns the offset of the value after a colon at b[i:], blanks
// allowed around it, or -1 when no colon or no value follows.
func afterColon(b []byte, i int) int {
	i = SkipSpace(b, i)
	if i >= len(b) || b[i] != ':' {
		return -1
	}
	if i = SkipSpace(b, i+1); i >= len(b) {
		return -1
	}
	return i
}
