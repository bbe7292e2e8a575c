package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/cespare/xxhash/v2"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Errors of the decoder. Every refusal wraps one of them.
var (
	// ErrMalformed: not a batch (bad msgpack, wrong shapes, a count past
	// the bytes that carry it, bad frames).
	ErrMalformed = errors.New("kvevents: malformed batch")
	// ErrRange: a number outside what an engine can send (a negative or
	// huge token id, a block size past MaxBlockSize, token ids that are not
	// block_size per hash).
	ErrRange = errors.New("kvevents: number out of range")

	// The refusals Refusal names apart, each wrapping one of the above.
	errTooLarge   = fmt.Errorf("%w: too large", ErrMalformed)
	errTokenID    = fmt.Errorf("%w: token id", ErrRange)
	errBlockSize  = fmt.Errorf("%w: block_size", ErrRange)
	errTokenCount = fmt.Errorf("%w: token ids", ErrRange)
)

// Why a message was refused, as Refusal names it: the reason label of the
// adapter's switchyard_adapter_kv_events_total{type="malformed"}.
const (
	RefusedTooLarge   = "too_large"   // a batch past MaxBatchBytes
	RefusedTokenID    = "token_id"    // a token id outside [0, MaxTokenID]
	RefusedBlockSize  = "block_size"  // a block_size outside [1, MaxBlockSize]
	RefusedTokenCount = "token_count" // token ids that are not block_size per hash
	RefusedRange      = "range"       // another number out of range
	RefusedShape      = "shape"       // not msgpack, or not an event batch
)

// Refusals lists every reason Refusal returns.
func Refusals() []string {
	return []string{RefusedTooLarge, RefusedTokenID, RefusedBlockSize, RefusedTokenCount, RefusedRange, RefusedShape}
}

// IsRefusal reports whether reason is one Refusal returns.
func IsRefusal(reason string) bool {
	switch reason {
	case RefusedTooLarge, RefusedTokenID, RefusedBlockSize, RefusedTokenCount, RefusedRange, RefusedShape:
		return true
	}
	return false
}

// Refusal names why err, a refusal of the decoder, refused a message.
func Refusal(err error) string {
	switch {
	case errors.Is(err, errTooLarge):
		return RefusedTooLarge
	case errors.Is(err, errTokenID):
		return RefusedTokenID
	case errors.Is(err, errBlockSize):
		return RefusedBlockSize
	case errors.Is(err, errTokenCount):
		return RefusedTokenCount
	case errors.Is(err, ErrRange):
		return RefusedRange
	}
	return RefusedShape
}

// maxDepth bounds the nesting of members the decoder skips: vLLM's deepest
// (extra_keys) is three levels down.
const maxDepth = 16

// DecodeBatch decodes one msgpack EventBatch. Events of a type it does not
// know are skipped and counted in unknown; a batch with any malformed or
// out-of-range part is refused whole.
func DecodeBatch(b []byte) (batch Batch, unknown int, err error) {
	if len(b) > MaxBatchBytes {
		return Batch{}, 0, fmt.Errorf("%w: %d bytes, more than %d", errTooLarge, len(b), MaxBatchBytes)
	}
	x := newDecoder(b)
	batch, unknown, err = x.batch()
	if err == nil && x.r.Len() != 0 {
		err = fmt.Errorf("%w: %d bytes after the batch", ErrMalformed, x.r.Len())
	}
	if err != nil {
		if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrRange) {
			err = fmt.Errorf("%w: %w", ErrMalformed, err)
		}
		return Batch{}, 0, err
	}
	return batch, unknown, nil
}

// DecodeMessage decodes a published message's three frames: topic, an
// 8-byte big-endian sequence number and the batch.
func DecodeMessage(frames [][]byte) (Message, int, error) {
	if len(frames) != 3 {
		return Message{}, 0, fmt.Errorf("%w: %d frames, want 3 (topic, seq, batch)", ErrMalformed, len(frames))
	}
	if len(frames[1]) != 8 {
		return Message{}, 0, fmt.Errorf("%w: sequence frame of %d bytes, want 8", ErrMalformed, len(frames[1]))
	}
	batch, unknown, err := DecodeBatch(frames[2])
	if err != nil {
		return Message{}, 0, err
	}
	return Message{Topic: string(frames[0]), Seq: binary.BigEndian.Uint64(frames[1]), Batch: batch}, unknown, nil
}

// FoldBytes folds a byte-string block hash (vLLM's sha256 mode) to a Hash.
func FoldBytes(b []byte) Hash { return Hash(xxhash.Sum64(b)) }

type decoder struct {
	r bytes.Reader
	d *msgpack.Decoder
}

func newDecoder(b []byte) *decoder {
	x := &decoder{}
	x.r.Reset(b)
	x.d = msgpack.NewDecoder(&x.r)
	return x
}

func (x *decoder) peek() (byte, error) { return x.d.PeekCode() }

// arrayLen reads an array header whose n elements, at least a byte each,
// must fit in what is left.
func (x *decoder) arrayLen() (int, error) {
	n, err := x.d.DecodeArrayLen()
	if err != nil {
		return 0, err
	}
	if n < 0 || n > x.r.Len() {
		return 0, fmt.Errorf("%w: array of %d in %d bytes", ErrMalformed, n, x.r.Len())
	}
	return n, nil
}

func (x *decoder) mapLen() (int, error) {
	n, err := x.d.DecodeMapLen()
	if err != nil {
		return 0, err
	}
	if n < 0 || 2*n > x.r.Len() {
		return 0, fmt.Errorf("%w: map of %d in %d bytes", ErrMalformed, n, x.r.Len())
	}
	return n, nil
}

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

// skip skips one value of any shape, bounding its nesting.
func (x *decoder) skip(depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("%w: nested deeper than %d", ErrMalformed, maxDepth)
	}
	c, err := x.peek()
	if err != nil {
		return err
	}
	switch {
	case isArray(c):
		n, err := x.arrayLen()
		if err != nil {
			return err
		}
		for range n {
			if err := x.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case isMap(c):
		n, err := x.mapLen()
		if err != nil {
			return err
		}
		for range 2 * n {
			if err := x.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	}
	return x.d.Skip()
}

// batch reads [ts, events, dp_rank] or {"ts", "events", "data_parallel_rank"}.
func (x *decoder) batch() (Batch, int, error) {
	b := Batch{DPRank: -1}
	unknown := 0
	c, err := x.peek()
	if err != nil {
		return b, 0, err
	}
	field := func(name string) error {
		var err error
		switch name {
		case "ts":
			b.TS, err = x.float()
		case "events":
			b.Events, unknown, err = x.events()
		case "data_parallel_rank":
			b.DPRank, err = x.optInt(-1, 0, 1<<16)
		default:
			err = x.skip(1)
		}
		return err
	}
	switch {
	case isArray(c):
		n, err := x.arrayLen()
		if err != nil {
			return b, 0, err
		}
		if n < 2 {
			return b, 0, fmt.Errorf("%w: batch of %d members, want [ts, events, ...]", ErrMalformed, n)
		}
		names := [...]string{"ts", "events", "data_parallel_rank"}
		for i := range n {
			name := ""
			if i < len(names) {
				name = names[i]
			}
			if err := field(name); err != nil {
				return b, 0, err
			}
		}
	case isMap(c):
		n, err := x.mapLen()
		if err != nil {
			return b, 0, err
		}
		seen := false
		for range n {
			name, err := x.key()
			if err != nil {
				return b, 0, err
			}
			seen = seen || name == "events"
			if err := field(name); err != nil {
				return b, 0, err
			}
		}
		if !seen {
			return b, 0, fmt.Errorf("%w: batch without events", ErrMalformed)
		}
	default:
		return b, 0, fmt.Errorf("%w: batch is neither an array nor a map (code %#x)", ErrMalformed, c)
	}
	return b, unknown, nil
}

func (x *decoder) events() ([]Event, int, error) {
	n, err := x.arrayLen()
	if err != nil {
		return nil, 0, err
	}
	evs := make([]Event, 0, n)
	unknown := 0
	for range n {
		ev, err := x.event()
		if err != nil {
			return nil, 0, err
		}
		if ev.Kind == 0 {
			unknown++
			continue
		}
		evs = append(evs, ev)
	}
	return evs, unknown, nil
}

// Positional members of each event after its tag, in vLLM's order; later
// members (extra_keys, group_idx, …) are skipped.
var (
	storedFields  = [...]string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"}
	removedFields = [...]string{"block_hashes", "medium"}
)

// event reads one event; Kind 0 is an event of an unknown type, skipped.
func (x *decoder) event() (Event, error) {
	var ev Event
	c, err := x.peek()
	if err != nil {
		return ev, err
	}
	var tag string
	seen := map[string]bool{}
	switch {
	case isArray(c):
		n, err := x.arrayLen()
		if err != nil {
			return ev, err
		}
		if n == 0 {
			return ev, fmt.Errorf("%w: empty event", ErrMalformed)
		}
		if tag, err = x.str(); err != nil {
			return ev, err
		}
		var names []string
		switch tag {
		case "BlockStored":
			names = storedFields[:]
		case "BlockRemoved":
			names = removedFields[:]
		}
		for i := 1; i < n; i++ {
			name := ""
			if i-1 < len(names) {
				name = names[i-1]
			}
			seen[name] = true
			if err := x.field(&ev, name); err != nil {
				return ev, err
			}
		}
	case isMap(c):
		n, err := x.mapLen()
		if err != nil {
			return ev, err
		}
		for range n {
			name, err := x.key()
			if err != nil {
				return ev, err
			}
			if name == "type" {
				if tag, err = x.str(); err != nil {
					return ev, err
				}
				continue
			}
			seen[name] = true
			if err := x.field(&ev, name); err != nil {
				return ev, err
			}
		}
	default:
		return ev, fmt.Errorf("%w: event is neither an array nor a map (code %#x)", ErrMalformed, c)
	}
	switch tag {
	case "BlockStored":
		ev.Kind = BlockStored
		for _, f := range storedFields[:4] {
			if !seen[f] {
				return ev, fmt.Errorf("%w: BlockStored without %s", ErrMalformed, f)
			}
		}
		if len(ev.Hashes) == 0 {
			return ev, fmt.Errorf("%w: BlockStored without block hashes", ErrMalformed)
		}
		if ev.BlockSize < 1 || ev.BlockSize > MaxBlockSize {
			return ev, fmt.Errorf("%w %d, want 1 to %d", errBlockSize, ev.BlockSize, MaxBlockSize)
		}
		if len(ev.TokenIDs) != len(ev.Hashes)*ev.BlockSize {
			return ev, fmt.Errorf("%w: %d for %d blocks of %d", errTokenCount, len(ev.TokenIDs), len(ev.Hashes), ev.BlockSize)
		}
	case "BlockRemoved":
		ev.Kind = BlockRemoved
		if !seen["block_hashes"] {
			return ev, fmt.Errorf("%w: BlockRemoved without block_hashes", ErrMalformed)
		}
	case "AllBlocksCleared":
		ev = Event{Kind: AllBlocksCleared}
	case "":
		return ev, fmt.Errorf("%w: event without a type", ErrMalformed)
	default:
		return Event{}, nil // a type this decoder does not know: skipped, counted
	}
	return ev, nil
}

// field decodes the member name into ev; unknown names are skipped.
func (x *decoder) field(ev *Event, name string) error {
	var err error
	switch name {
	case "block_hashes":
		ev.Hashes, err = x.hashes()
	case "parent_block_hash":
		ev.Parent, ev.HasParent, err = x.hash()
	case "token_ids":
		ev.TokenIDs, err = x.tokens()
	case "block_size":
		ev.BlockSize, err = x.optInt(0, 0, MaxBlockSize)
		if errors.Is(err, ErrRange) {
			err = fmt.Errorf("%w %v", errBlockSize, strings.TrimPrefix(err.Error(), ErrRange.Error()+": "))
		}
	case "lora_id":
		ev.LoraID, err = x.optInt(0, 0, math.MaxInt32)
	case "medium":
		ev.Medium, err = x.optStr()
	case "lora_name":
		ev.LoraName, err = x.optStr()
	default:
		err = x.skip(1)
	}
	return err
}

func (x *decoder) hashes() ([]Hash, error) {
	n, err := x.arrayLen()
	if err != nil {
		return nil, err
	}
	hs := make([]Hash, 0, n)
	for range n {
		h, ok, err := x.hash()
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("%w: nil block hash", ErrMalformed)
		}
		hs = append(hs, h)
	}
	return hs, nil
}

// hash reads a block hash: an integer (unsigned 64-bit, or a signed one
// taken as its two's complement), bytes (folded) or nil (ok false).
func (x *decoder) hash() (Hash, bool, error) {
	c, err := x.peek()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c == msgpcode.Nil:
		return 0, false, x.d.DecodeNil()
	case msgpcode.IsBin(c) || msgpcode.IsString(c):
		b, err := x.d.DecodeBytes()
		if err != nil {
			return 0, false, err
		}
		if len(b) == 0 || len(b) > 64 {
			return 0, false, fmt.Errorf("%w: block hash of %d bytes", ErrRange, len(b))
		}
		return FoldBytes(b), true, nil
	case msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Int64):
		v, err := x.d.DecodeUint64()
		return Hash(v), true, err
	}
	return 0, false, fmt.Errorf("%w: block hash of code %#x", ErrMalformed, c)
}

func (x *decoder) tokens() ([]uint32, error) {
	n, err := x.arrayLen()
	if err != nil {
		return nil, err
	}
	ts := make([]uint32, n)
	for i := range ts {
		v, err := x.int()
		if errors.Is(err, ErrRange) {
			err = fmt.Errorf("%w %v", errTokenID, strings.TrimPrefix(err.Error(), ErrRange.Error()+": "))
		}
		if err != nil {
			return nil, err
		}
		if v < 0 || v > MaxTokenID {
			return nil, fmt.Errorf("%w %d", errTokenID, v)
		}
		ts[i] = uint32(v)
	}
	return ts, nil
}

// int reads an integer, refusing anything else (msgpack's own decoder
// would turn nil into 0 and a float into its truncation).
func (x *decoder) int() (int64, error) {
	c, err := x.peek()
	if err != nil {
		return 0, err
	}
	if !msgpcode.IsFixedNum(c) && (c < msgpcode.Uint8 || c > msgpcode.Int64) {
		return 0, fmt.Errorf("%w: want an integer, got code %#x", ErrMalformed, c)
	}
	if c == msgpcode.Uint64 {
		v, err := x.d.DecodeUint64()
		if v > math.MaxInt64 {
			return 0, fmt.Errorf("%w: %d", ErrRange, v)
		}
		return int64(v), err
	}
	return x.d.DecodeInt64()
}

// optInt reads nil (def) or an integer in [lo, hi].
func (x *decoder) optInt(def int, lo, hi int64) (int, error) {
	c, err := x.peek()
	if err != nil {
		return 0, err
	}
	if c == msgpcode.Nil {
		return def, x.d.DecodeNil()
	}
	v, err := x.int()
	if err != nil {
		return 0, err
	}
	if v < lo || v > hi {
		return 0, fmt.Errorf("%w: %d not in [%d, %d]", ErrRange, v, lo, hi)
	}
	return int(v), nil
}

func (x *decoder) float() (float64, error) {
	c, err := x.peek()
	if err != nil {
		return 0, err
	}
	if c == msgpcode.Float || c == msgpcode.Double || msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Int64) {
		return x.d.DecodeFloat64()
	}
	return 0, fmt.Errorf("%w: want a number, got code %#x", ErrMalformed, c)
}

func (x *decoder) str() (string, error) {
	c, err := x.peek()
	if err != nil {
		return "", err
	}
	if !msgpcode.IsString(c) {
		return "", fmt.Errorf("%w: want a string, got code %#x", ErrMalformed, c)
	}
	return x.d.DecodeString()
}

func (x *decoder) optStr() (string, error) {
	c, err := x.peek()
	if err != nil {
		return "", err
	}
	if c == msgpcode.Nil {
		return "", x.d.DecodeNil()
	}
	return x.str()
}

// key reads a map key, which vLLM always sends as a string.
func (x *decoder) key() (string, error) { return x.str() }
