package lab

// A trace names its prompts' content only by block hash ids; replaying it
// through a running system needs text. TraceText writes each hash id as a
// fixed block of text derived from the id alone, so equal ids give
// byte-equal text on every run and in every process, and two prompts share
// their text exactly as far as they share their hash ids.

// traceWordBytes is one word of trace text: a space and three lowercase
// letters, one token by the four-bytes-a-token estimate the gateway and
// the simulated engine use.
const traceWordBytes = 4

// traceUniqueSpace keeps the ids of a prompt's own text (tokens past its
// last hash id) apart from every trace hash id.
const traceUniqueSpace = 1 << 63

// TraceText appends rec's prompt: the text of each of its hash ids, a
// block of blockTokens words each, in order, cut to rec.Input words; words
// past the last hash id are the prompt's own, drawn from unique (give each
// request of a run its own, e.g. its line number).
func TraceText(dst []byte, rec *TraceRecord, blockTokens int, unique uint64) []byte {
	left := rec.Input
	for _, h := range rec.Hashes {
		if left <= 0 {
			return dst
		}
		n := min(blockTokens, left)
		dst = appendWords(dst, h, n)
		left -= n
	}
	if left > 0 {
		dst = appendWords(dst, traceUniqueSpace|unique, left)
	}
	return dst
}

// appendWords appends the first n words of id's block: word k is drawn
// from mix(id, k), three letters a 64-bit draw.
func appendWords(dst []byte, id uint64, n int) []byte {
	seed := mix(id ^ 0x7261_6365_7465_7874) // "racetext"
	for k := range n {
		z := mix(seed + uint64(k)*0x9e3779b97f4a7c15)
		dst = append(dst, ' ', 'a'+byte(z%26), 'a'+byte(z/26%26), 'a'+byte(z/676%26))
	}
	return dst
}
