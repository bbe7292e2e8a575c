package features

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"unicode"
	"unicode/utf8"
)

// A request body is read in two passes. The first (scanner) validates the
// whole body as encoding/json would and notes where the top-level fields
// routing reads begin and end; it reads string contents eight bytes at a
// time. The second renders the prompt from the noted field, trusting the
// syntax the first pass checked, so it finds string ends and escapes with
// bytes.IndexByte and copies the runs between them whole. Neither builds a
// value tree, so the work is a few passes over memory and no allocation
// beyond the prompt buffer.

// Top-level fields, in the order encoding/json would report them.
const (
	fModel = iota
	fStream
	fStreamOptions
	fMaxTokens
	fMaxCompletionTokens
	fMessages
	fPrompt
	fInput
	fSystem
	fInstructions
	fMaxOutputTokens
	fPreviousResponseID
	fN
	fBestOf
	numFields
)

func fieldName(f int) string {
	switch f {
	case fModel:
		return "model"
	case fStream:
		return "stream"
	case fStreamOptions:
		return "stream_options"
	case fMaxTokens:
		return "max_tokens"
	case fMaxCompletionTokens:
		return "max_completion_tokens"
	case fMessages:
		return "messages"
	case fPrompt:
		return "prompt"
	case fInput:
		return "input"
	case fSystem:
		return "system"
	case fInstructions:
		return "instructions"
	case fMaxOutputTokens:
		return "max_output_tokens"
	case fPreviousResponseID:
		return "previous_response_id"
	case fN:
		return "n"
	case fBestOf:
		return "best_of"
	}
	return ""
}

// topField is the field a top-level key names, or -1. key is the quoted
// literal; plain says it holds no escape and no byte above ASCII.
func topField(key []byte, plain bool) int {
	if plain {
		switch string(key[1 : len(key)-1]) {
		case "model":
			return fModel
		case "stream":
			return fStream
		case "stream_options":
			return fStreamOptions
		case "max_tokens":
			return fMaxTokens
		case "max_completion_tokens":
			return fMaxCompletionTokens
		case "messages":
			return fMessages
		case "prompt":
			return fPrompt
		case "input":
			return fInput
		case "system":
			return fSystem
		case "instructions":
			return fInstructions
		case "max_output_tokens":
			return fMaxOutputTokens
		case "previous_response_id":
			return fPreviousResponseID
		case "n":
			return fN
		case "best_of":
			return fBestOf
		}
	}
	for f := range numFields {
		if keyMatches(key, plain, fieldName(f)) {
			return f
		}
	}
	return -1
}

// keyMatches reports whether the quoted key selects the struct field name as
// encoding/json matches them: exactly, else under Unicode case folding
// ("MODEL", "Model" and "\u006dodel" all select model, and so do the Kelvin
// sign for k and the long s for s).
func keyMatches(key []byte, plain bool, name string) bool {
	if plain {
		s := key[1 : len(key)-1]
		if string(s) == name {
			return true
		}
		// Plain ASCII folds only to ASCII: a length mismatch settles it.
		return len(s) == len(name) && asciiEqualFold(s, name)
	}
	var k string
	if json.Unmarshal(key, &k) != nil {
		return false
	}
	return k == name || foldEqual(k, name)
}

func asciiEqualFold(s []byte, name string) bool {
	for i := range len(s) {
		a, b := s[i], name[i]
		if 'a' <= a && a <= 'z' {
			a -= 'a' - 'A'
		}
		if 'a' <= b && b <= 'z' {
			b -= 'a' - 'A'
		}
		if a != b {
			return false
		}
	}
	return true
}

// foldEqual compares two names rune by rune under the fold encoding/json
// uses: each rune replaced by the smallest rune of its fold set.
func foldEqual(a, b string) bool {
	for a != "" && b != "" {
		ra, na := utf8.DecodeRuneInString(a)
		rb, nb := utf8.DecodeRuneInString(b)
		if foldRune(ra) != foldRune(rb) {
			return false
		}
		a, b = a[na:], b[nb:]
	}
	return a == "" && b == ""
}

func foldRune(r rune) rune {
	if r < utf8.RuneSelf {
		if 'a' <= r && r <= 'z' {
			r -= 'a' - 'A'
		}
		return r
	}
	for {
		r2 := unicode.SimpleFold(r)
		if r2 <= r {
			return r2
		}
		r = r2
	}
}

// maxDepth is encoding/json's nesting limit.
const maxDepth = 10000

// scanner is the validating first pass.
type scanner struct {
	b       []byte
	i       int
	depth   int
	badUTF8 bool // a string holds invalid UTF-8 (valid syntax all the same)
}

// top validates the whole body. fields receives the spans of the known
// top-level fields (the last of duplicates, as encoding/json keeps);
// object reports that the body is an object (or null, which encoding/json
// leaves a struct untouched for).
func (s *scanner) top(fields *[numFields][]byte) (object, ok bool) {
	s.ws()
	if s.i >= len(s.b) {
		return false, false
	}
	switch s.b[s.i] {
	case '{':
		object, ok = true, s.object(fields)
	case 'n':
		object, ok = true, s.lit("null")
	default:
		ok = s.value()
	}
	s.ws()
	return object, ok && s.i == len(s.b)
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) value() bool {
	if s.i >= len(s.b) {
		return false
	}
	switch s.b[s.i] {
	case '"':
		_, ok := s.str()
		return ok
	case '{':
		return s.object(nil)
	case '[':
		return s.array()
	case 't':
		return s.lit("true")
	case 'f':
		return s.lit("false")
	case 'n':
		return s.lit("null")
	}
	return s.number()
}

func (s *scanner) lit(want string) bool {
	if len(s.b)-s.i < len(want) || string(s.b[s.i:s.i+len(want)]) != want {
		return false
	}
	s.i += len(want)
	return true
}

func (s *scanner) object(fields *[numFields][]byte) bool {
	if s.depth++; s.depth > maxDepth {
		return false
	}
	s.i++ // '{'
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == '}' {
		s.i++
		s.depth--
		return true
	}
	for {
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return false
		}
		k := s.i
		plain, ok := s.str()
		if !ok {
			return false
		}
		key := s.b[k:s.i]
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return false
		}
		s.i++
		s.ws()
		v := s.i
		if !s.value() {
			return false
		}
		if fields != nil {
			if f := topField(key, plain); f >= 0 {
				fields[f] = s.b[v:s.i]
			}
		}
		if end, ok := s.next('}'); !ok || end {
			return ok
		}
	}
}

// next reads what follows a member of an object or an element of an array:
// a comma (more follow) or the closing byte (the container ends). ok is
// false for anything else.
func (s *scanner) next(closing byte) (end, ok bool) {
	s.ws()
	if s.i >= len(s.b) {
		return false, false
	}
	switch s.b[s.i] {
	case ',':
		s.i++
		s.ws()
		return false, true
	case closing:
		s.i++
		s.depth--
		return true, true
	}
	return false, false
}

func (s *scanner) array() bool {
	if s.depth++; s.depth > maxDepth {
		return false
	}
	s.i++ // '['
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == ']' {
		s.i++
		s.depth--
		return true
	}
	for {
		if !s.value() {
			return false
		}
		if end, ok := s.next(']'); !ok || end {
			return ok
		}
	}
}

func (s *scanner) number() bool {
	b, i := s.b, s.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(b, i)
	default:
		return false
	}
	if i < len(b) && b[i] == '.' {
		j := digits(b, i+1)
		if j == i+1 {
			return false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i {
			return false
		}
		i = j
	}
	s.i = i
	return true
}

func digits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// plainWord reports that none of the eight bytes of x ends a string run: no
// '"', no '\\', no control character and nothing above ASCII. With every
// byte below 0x80 the subtractions below borrow into a byte's high bit only
// for a byte under 0x20, or one that equals the quote or the backslash
// (after the XOR), or above a byte that did; x itself carries the high bits
// of non-ASCII bytes.
func plainWord(x uint64) bool { return special(x)&highs == 0 }

// plainWords is plainWord over 32 bytes, with one branch.
func plainWords(b []byte) bool {
	_ = b[31]
	x0 := binary.LittleEndian.Uint64(b)
	x1 := binary.LittleEndian.Uint64(b[8:])
	x2 := binary.LittleEndian.Uint64(b[16:])
	x3 := binary.LittleEndian.Uint64(b[24:])
	return (special(x0)|special(x1)|special(x2)|special(x3))&highs == 0
}

// special has a byte's high bit set where plainWord would find it special
// (and possibly above such a byte).
func special(x uint64) uint64 {
	q := x ^ (ones * '"')
	bs := x ^ (ones * '\\')
	return x | (x - ones*0x20) | (q - ones) | (bs - ones)
}

// str validates the string at s.b[s.i] == '"' and moves past it. plain
// reports that it held no escape and nothing above ASCII.
func (s *scanner) str() (plain, ok bool) {
	b := s.b
	i := s.i + 1
	plain = true
	for {
		for i+32 <= len(b) && plainWords(b[i:i+32]) {
			i += 32
		}
		for i+8 <= len(b) && plainWord(binary.LittleEndian.Uint64(b[i:])) {
			i += 8
		}
		if i >= len(b) {
			return false, false
		}
		c := b[i]
		switch {
		case c == '"':
			s.i = i + 1
			return plain, true
		case c == '\\':
			plain = false
			if i+1 >= len(b) {
				return false, false
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) {
					return false, false
				}
				for _, h := range b[i+2 : i+6] {
					if _, ok := hexDigit(h); !ok {
						return false, false
					}
				}
				i += 6
			default:
				return false, false
			}
		case c < 0x20:
			return false, false
		case c < utf8.RuneSelf:
			i++
		default:
			plain = false
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n == 1 {
				s.badUTF8 = true
			}
			i += n
		}
	}
}

// The second pass reads values the scanner has validated.

// skipWS returns the offset of the first non-blank byte at or after i.
func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the offset just past the valid string starting at
// b[i] == '"': the first quote not escaped, that is not preceded by an odd
// run of backslashes.
func stringEnd(b []byte, i int) int {
	j := i + 1
	for {
		q := j + bytes.IndexByte(b[j:], '"')
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

// valueEnd returns the offset just past the valid value starting at b[i].
func valueEnd(b []byte, i int) int {
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for j := i; ; j++ {
			switch b[j] {
			case '"':
				j = stringEnd(b, j) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
	}
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
		j++
	}
	return j
}

// elems walks the elements of a valid array.
type elems struct {
	b []byte
	i int
}

func newElems(arr []byte) elems { return elems{b: arr, i: 1} }

// next returns the next element, or false after the last.
func (e *elems) next() ([]byte, bool) {
	i := skipWS(e.b, e.i)
	if e.b[i] == ',' {
		i = skipWS(e.b, i+1)
	}
	if e.b[i] == ']' {
		return nil, false
	}
	end := valueEnd(e.b, i)
	e.i = end
	return e.b[i:end], true
}

// members walks the members of a valid object.
type members struct {
	b []byte
	i int
}

// next returns the next quoted key and its value, or false after the last.
func (m *members) next() (key, val []byte, ok bool) {
	i := skipWS(m.b, m.i)
	if m.b[i] == ',' {
		i = skipWS(m.b, i+1)
	}
	if m.b[i] == '}' {
		return nil, nil, false
	}
	ke := stringEnd(m.b, i)
	key = m.b[i:ke]
	v := skipWS(m.b, ke)
	v = skipWS(m.b, v+1) // past ':'
	end := valueEnd(m.b, v)
	m.i = end
	return key, m.b[v:end], true
}

// lookup2 returns the values of the members named a and b of a valid object
// (the last of duplicates), matching keys as encoding/json does.
func lookup2(obj []byte, a, b string) (va, vb []byte) {
	m := members{b: obj, i: 1}
	for {
		key, val, ok := m.next()
		if !ok {
			return va, vb
		}
		plain := bytes.IndexByte(key, '\\') < 0 && ascii(key)
		switch {
		case keyMatches(key, plain, a):
			va = val
		case keyMatches(key, plain, b):
			vb = val
		}
	}
}

func ascii(b []byte) bool {
	for len(b) >= 8 {
		if binary.LittleEndian.Uint64(b)&highs != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}
