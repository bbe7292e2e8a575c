package lab

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// segment is a run of prompt tokens with one identity: a system prompt, a
// user turn, an answer, a document. Equal ids mean equal text, so two
// prompts share their tokens up to the first segment where they differ.
type segment struct {
	id     uint64
	tokens int
}

// chain appends the chained hashes of the prompt's full blocks of
// blockTokens tokens, the way features.AppendPrefix chains hashes over
// bytes: h[0] = xxhash(block[0]), h[i] = xxhash(h[i-1] as 8 little-endian
// bytes || block[i]). A block's bytes are the (segment id, offset, length)
// of each piece of a segment it holds, which stands for the text. A
// trailing partial block is left out, as an engine does.
func chain(dst []uint64, segs []segment, blockTokens int) []uint64 {
	var d xxhash.Digest
	var buf [16]byte
	var prev [8]byte
	si, off := 0, 0 // current segment and offset in it
	total := 0
	for _, s := range segs {
		total += s.tokens
	}
	for b := 0; b < total/blockTokens; b++ {
		d.Reset()
		if b > 0 {
			_, _ = d.Write(prev[:])
		}
		need := blockTokens
		for need > 0 {
			s := segs[si]
			n := min(need, s.tokens-off)
			binary.LittleEndian.PutUint64(buf[0:], s.id)
			binary.LittleEndian.PutUint32(buf[8:], uint32(off))
			binary.LittleEndian.PutUint32(buf[12:], uint32(n))
			_, _ = d.Write(buf[:])
			need -= n
			if off += n; off == s.tokens {
				si, off = si+1, 0
			}
		}
		h := d.Sum64()
		binary.LittleEndian.PutUint64(prev[:], h)
		dst = append(dst, h)
	}
	return dst
}

// routerPrefix derives the router's prefix blocks from the engine's chain.
// The router hashes blocks of prefix_block_chars characters (four per
// token) and an engine blocks of BlockTokens tokens; since a chained hash
// names the whole prefix up to its block, every engine hash that ends where
// a router block ends names the same prefix, so it serves as that router
// block's id. Both sides then agree on which prompts share a prefix.
func routerPrefix(engine []uint64, engineBlockTokens, blockChars, maxBlocks int) []uint64 {
	per := max(1, blockChars/charsPerToken/engineBlockTokens)
	n := min(len(engine)/per, maxBlocks)
	out := make([]uint64, n)
	for i := range n {
		out[i] = engine[(i+1)*per-1]
	}
	return out
}

// charsPerToken is the gateway's token estimate (bytes / 4).
const charsPerToken = 4
