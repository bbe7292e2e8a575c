// Package clip shortens text a sender controls before it goes into a log
// line, an error message or a stored name, so that neither grows with what
// was sent.
package clip

import "unicode/utf8"

// Ellipsis marks where Text cut.
const Ellipsis = "…"

// Text is s when it has at most n bytes. Otherwise it is the longest start
// of s that ends where a UTF-8 character starts and leaves room for
// Ellipsis, followed by Ellipsis: at most n bytes in all, so a bound on the
// result holds whatever s is. Below len(Ellipsis) bytes there is no room
// for the mark, and the cut stands alone.
func Text[T ~string | ~[]byte](s T, n int) string {
	if len(s) <= n {
		return string(s)
	}
	n = max(n, 0)
	mark := ""
	if n >= len(Ellipsis) {
		n -= len(Ellipsis)
		mark = Ellipsis
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return string(s[:n]) + mark
}
