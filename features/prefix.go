package features

import (
	"encoding/binary"
	"errors"
	"strconv"
	"strings"

	"github.com/cespare/xxhash/v2"

	"github.com/switchyard-llm/switchyard/internal/jsonscan"
)

// MaxPrefixBlocks is the most blocks a Llm-Prefix header may carry (the
// table's prefix_max_blocks is capped at the same value).
const MaxPrefixBlocks = 256

// ErrPrefixHeader is wrapped by every Llm-Prefix parse failure.
var ErrPrefixHeader = errors.New("invalid Llm-Prefix")

// AppendPrefix appends the chained hashes of the whole blocks of prompt:
// blocks of blockChars bytes (a trailing partial block is left out), at most
// maxBlocks of them, h[0] = xxhash(block[0]) and h[i] = xxhash(h[i-1] as 8
// little-endian bytes || block[i]). Chaining makes h[i] name the whole prefix
// up to block i, so equal hashes mean equal prefixes, and the longest shared
// hash is the longest shared prefix (docs/protocol.md, "Prefix features").
// blockChars or maxBlocks ≤ 0 appends nothing.
func AppendPrefix(dst []uint64, prompt []byte, blockChars, maxBlocks int) []uint64 {
	if blockChars <= 0 || maxBlocks <= 0 {
		return dst
	}
	n := min(len(prompt)/blockChars, maxBlocks)
	var d xxhash.Digest
	var prev [8]byte
	for i := 0; i < n; i++ {
		block := prompt[i*blockChars : (i+1)*blockChars]
		var h uint64
		if i == 0 {
			h = xxhash.Sum64(block)
		} else {
			d.Reset()
			_, _ = d.Write(prev[:])
			_, _ = d.Write(block)
			h = d.Sum64()
		}
		binary.LittleEndian.PutUint64(prev[:], h)
		dst = append(dst, h)
	}
	return dst
}

// AppendPrefixHeader appends blocks as a Llm-Prefix value: comma-separated
// lowercase hex without leading zeros.
func AppendPrefixHeader(dst []byte, blocks []uint64) []byte {
	for i, h := range blocks {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, h, 16)
	}
	return dst
}

// FormatPrefixHeader returns blocks as a Llm-Prefix value.
func FormatPrefixHeader(blocks []uint64) string {
	var sb strings.Builder
	sb.Grow(17 * len(blocks))
	var tmp [16]byte
	for i, h := range blocks {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.Write(strconv.AppendUint(tmp[:0], h, 16))
	}
	return sb.String()
}

// ParsePrefixHeader appends the hashes of a Llm-Prefix value to dst. It
// accepts what AppendPrefixHeader writes, plus upper-case digits, leading
// zeros and blanks around items, and allocates nothing beyond growing dst
// (none when dst has room). An empty value is no blocks.
func ParsePrefixHeader(dst []uint64, v string) ([]uint64, error) {
	if strings.TrimSpace(v) == "" {
		return dst, nil
	}
	n := 0
	for {
		item, rest, more := strings.Cut(v, ",")
		h, ok := parseHex64(strings.Trim(item, " \t"))
		if !ok {
			return dst, prefixErr(n)
		}
		if n++; n > MaxPrefixBlocks {
			return dst, errors.Join(ErrPrefixHeader, errTooManyBlocks)
		}
		dst = append(dst, h)
		if !more {
			return dst, nil
		}
		v = rest
	}
}

var errTooManyBlocks = errors.New("more than " + strconv.Itoa(MaxPrefixBlocks) + " blocks")

func prefixErr(i int) error {
	return errors.Join(ErrPrefixHeader, errors.New("item "+strconv.Itoa(i)+" is not 1 to 16 hex digits"))
}

func parseHex64(s string) (uint64, bool) {
	if len(s) == 0 || len(s) > 16 {
		return 0, false
	}
	var h uint64
	for i := 0; i < len(s); i++ {
		v, ok := jsonscan.HexDigit(s[i])
		if !ok {
			return 0, false
		}
		h = h<<4 | uint64(v)
	}
	return h, true
}
