// Package jsonscan reads JSON bodies without decoding them: the request
// bodies the gateway routes on and the adapter rewrites for its engine, and
// the responses the adapter and the gateway look into for usage and text.
// Those bodies can be megabytes of prompt around a few fields that matter,
// so nothing here builds a value tree or allocates per value.
//
// It has two kinds of reader, kept apart on purpose:
//
//   - Validate checks a whole body as encoding/json would and reports its
//     top-level members on the way (validate.go). It reads string contents
//     32 and 8 bytes per step.
//   - The skippers (skip.go) find where a value ends, walk the members of an
//     object or the elements of an array, and search a window for a key.
//     They check punctuation only, jumping from quote to quote with
//     bytes.IndexByte, and never read past the input: safe on anything,
//     exact on what Validate accepted, and the right tool when another
//     parser (the engine's) judges the rest.
//
// Keys are matched two ways (key.go): Key.Equal exactly after unescaping,
// as a Python or Go map decoder reads them, and Key.EqualFold under Unicode
// case folding, as encoding/json selects a struct field.
package jsonscan

import (
	"encoding/binary"
	"unicode/utf8"
)

// MaxDepth is encoding/json's nesting limit, which Validate keeps.
const MaxDepth = 10000

// Result is what Validate learns about a valid body besides its validity.
type Result struct {
	// Top is the first byte of the top-level value: '{' for an object,
	// '[', '"', 't', 'f', 'n', or the first byte of a number.
	Top byte
	// BadUTF8 reports a string holding invalid UTF-8: valid syntax all the
	// same, which encoding/json decodes with U+FFFD in place of the bytes.
	BadUTF8 bool
}

// Valid reports whether b is one JSON value as encoding/json accepts it.
func Valid(b []byte) bool {
	_, ok := Validate(b, nil)
	return ok
}

// Validate reports whether b is exactly one JSON value, blanks around it
// allowed, accepting and refusing what encoding/json does (the same
// grammar, nesting up to MaxDepth). If member is not nil and the value is an
// object, member is called for each of its members, in order and duplicates
// included, once the member's value has been read: a member can be reported
// before a syntax error further on is found.
func Validate(b []byte, member func(k Key, value []byte)) (Result, bool) {
	s := scanner{b: b}
	s.ws()
	if s.i >= len(s.b) {
		return Result{}, false
	}
	r := Result{Top: s.b[s.i]}
	var ok bool
	if r.Top == '{' {
		ok = s.object(member)
	} else {
		ok = s.value()
	}
	s.ws()
	r.BadUTF8 = s.badUTF8
	return r, ok && s.i == len(s.b)
}

// scanner is Validate's state.
type scanner struct {
	b       []byte
	i       int
	depth   int
	badUTF8 bool
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

func (s *scanner) object(member func(Key, []byte)) bool {
	if s.depth++; s.depth > MaxDepth {
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
		if member != nil {
			member(Key{Quoted: key, Plain: plain}, s.b[v:s.i])
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
	if s.depth++; s.depth > MaxDepth {
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

// plainByte is plainWord for one byte.
func plainByte(c byte) bool {
	return c >= 0x20 && c < utf8.RuneSelf && c != '"' && c != '\\'
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
					if _, ok := HexDigit(h); !ok {
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
			// The word that failed holds a special byte: walk to it a byte
			// at a time rather than testing words at every byte.
			for i++; i < len(b) && plainByte(b[i]); i++ {
			}
		default:
			plain = false
			// A run of letters outside ASCII (accents, CJK) is decoded
			// rune by rune, not word-tested between runes.
			for i < len(b) && b[i] >= utf8.RuneSelf {
				r, n := utf8.DecodeRune(b[i:])
				if r == utf8.RuneError && n == 1 {
					s.badUTF8 = true
				}
				i += n
			}
		}
	}
}

// HexDigit is the value of one hex digit, either case: for JSON's \u
// escapes here, and for every other hex a caller reads.
func HexDigit(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
