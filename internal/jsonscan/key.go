package jsonscan

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"unicode"
	"unicode/utf8"
)

// Key is the key of an object member as it stands in the body.
type Key struct {
	// Quoted is the string literal, quotes included.
	Quoted []byte
	// Plain says the literal holds no escape and no byte above ASCII, so it
	// reads as it stands and folds to ASCII only.
	Plain bool
}

// keyOf is the Key of a string literal.
func keyOf(quoted []byte) Key {
	return Key{Quoted: quoted, Plain: bytes.IndexByte(quoted, '\\') < 0 && ascii(quoted)}
}

// Equal reports whether the key is name exactly once unescaped
// ("mod\u0065l" is "model"; "Model" is not), as Python's json and a Go map
// read keys. It decides what an engine reading the body will see.
func (k Key) Equal(name string) bool {
	q := k.Quoted
	if bytes.IndexByte(q, '\\') < 0 {
		return string(q[1:len(q)-1]) == name
	}
	var s string
	return json.Unmarshal(q, &s) == nil && s == name
}

// EqualFold reports whether the key selects the struct field name as
// encoding/json matches them: exactly, else under Unicode case folding
// ("MODEL", "Model" and "\u006dodel" all select model, and so do the Kelvin
// sign for k and the long s for s).
func (k Key) EqualFold(name string) bool {
	if k.Plain {
		s := k.Quoted[1 : len(k.Quoted)-1]
		if string(s) == name {
			return true
		}
		// Plain ASCII folds only to ASCII: a length mismatch settles it.
		return len(s) == len(name) && asciiEqualFold(s, name)
	}
	var s string
	if json.Unmarshal(k.Quoted, &s) != nil {
		return false
	}
	return s == name || foldEqual(s, name)
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
