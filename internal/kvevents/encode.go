package kvevents

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Format is how an encoder writes events: vLLM has sent both.
type Format string

const (
	// FormatArray: the batch and its events as positional arrays, each
	// event tagged by its name first (vLLM until mid-2026).
	FormatArray Format = "array"
	// FormatMap: the batch and its events as maps, events with a "type"
	// member (vLLM since mid-2026).
	FormatMap Format = "map"
)

// ParseFormat checks a --kv-events-format value.
func ParseFormat(s string) (Format, error) {
	switch f := Format(s); f {
	case FormatArray, FormatMap:
		return f, nil
	}
	return "", fmt.Errorf("want %s or %s", FormatArray, FormatMap)
}

// AppendBatch appends b encoded as msgpack in format f, as vLLM writes it:
// hashes as unsigned integers, a nil parent for a chain's first block.
func AppendBatch(dst []byte, b *Batch, f Format) []byte {
	buf := bytes.NewBuffer(dst)
	e := msgpack.NewEncoder(buf)
	// Writes to a bytes.Buffer do not fail; the encoder's errors are
	// only the writer's.
	if f == FormatMap {
		_ = e.EncodeMapLen(3)
		_ = e.EncodeString("ts")
		_ = e.EncodeFloat64(b.TS)
		_ = e.EncodeString("events")
		encodeEvents(e, b.Events, f)
		_ = e.EncodeString("data_parallel_rank")
	} else {
		_ = e.EncodeArrayLen(3)
		_ = e.EncodeFloat64(b.TS)
		encodeEvents(e, b.Events, f)
	}
	if b.DPRank < 0 {
		_ = e.EncodeNil()
	} else {
		_ = e.EncodeInt(int64(b.DPRank))
	}
	return buf.Bytes()
}

func encodeEvents(e *msgpack.Encoder, evs []Event, f Format) {
	_ = e.EncodeArrayLen(len(evs))
	for i := range evs {
		encodeEvent(e, &evs[i], f)
	}
}

func encodeEvent(e *msgpack.Encoder, ev *Event, f Format) {
	var names []string
	switch ev.Kind {
	case BlockStored:
		names = storedFields[:]
	case BlockRemoved:
		names = removedFields[:]
	}
	if f == FormatMap {
		_ = e.EncodeMapLen(1 + len(names))
		_ = e.EncodeString("type")
	} else {
		_ = e.EncodeArrayLen(1 + len(names))
	}
	_ = e.EncodeString(ev.Kind.String())
	for _, name := range names {
		if f == FormatMap {
			_ = e.EncodeString(name)
		}
		switch name {
		case "block_hashes":
			_ = e.EncodeArrayLen(len(ev.Hashes))
			for _, h := range ev.Hashes {
				_ = e.EncodeUint(uint64(h))
			}
		case "parent_block_hash":
			if ev.HasParent {
				_ = e.EncodeUint(uint64(ev.Parent))
			} else {
				_ = e.EncodeNil()
			}
		case "token_ids":
			_ = e.EncodeArrayLen(len(ev.TokenIDs))
			for _, t := range ev.TokenIDs {
				_ = e.EncodeUint(uint64(t))
			}
		case "block_size":
			_ = e.EncodeInt(int64(ev.BlockSize))
		case "lora_id":
			if ev.LoraID == 0 {
				_ = e.EncodeNil()
			} else {
				_ = e.EncodeInt(int64(ev.LoraID))
			}
		case "medium":
			encodeOptString(e, ev.Medium)
		case "lora_name":
			encodeOptString(e, ev.LoraName)
		}
	}
}

func encodeOptString(e *msgpack.Encoder, s string) {
	if s == "" {
		_ = e.EncodeNil()
	} else {
		_ = e.EncodeString(s)
	}
}

// SeqFrame is a sequence number as its 8-byte big-endian frame.
func SeqFrame(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// EndSeq is the replay's end marker: -1 as 8 big-endian bytes.
const EndSeq = ^uint64(0)
