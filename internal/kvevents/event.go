// Package kvevents speaks vLLM's KV-cache event feed: the msgpack event
// batches an engine publishes on a ZMQ PUB socket when it runs with
// --kv-events-config, the three-frame messages that carry them, and the
// replay socket that resends what a subscriber missed (docs/protocol.md,
// "KV-cache events").
//
// The decoder reads both encodings vLLM has used: events as positional
// arrays tagged by their name (["BlockStored", hashes, parent, ...]) and as
// maps with a "type" member, inside a batch that is [ts, events, dp_rank]
// or a map. Fields vLLM may leave out (omit_defaults) may be missing,
// members it adds later are skipped, and every count is bounded by the
// bytes that carry it, so a hostile batch costs no more than its size.
package kvevents

// Kind is an event's type.
type Kind uint8

// The event types vLLM publishes.
const (
	BlockStored Kind = iota + 1
	BlockRemoved
	AllBlocksCleared
)

func (k Kind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "unknown"
}

// Hash is an engine's block hash. vLLM sends an unsigned 64-bit integer by
// default (often above 2^63) or, with a sha256 hash function, 32 raw bytes;
// bytes are folded to 64 bits (FoldBytes), which is all a router needs to
// follow parents and removals.
type Hash uint64

// Event is one KV-cache event. Stored events carry the token ids of the
// full blocks they store, BlockSize of them per hash.
type Event struct {
	Kind      Kind
	Hashes    []Hash
	Parent    Hash
	HasParent bool // false: the first block of a chain (nil parent)
	TokenIDs  []uint32
	BlockSize int
	LoraID    int // 0: none
	LoraName  string
	Medium    string // "GPU", "CPU", …; "" when not sent
}

// Batch is one EventBatch.
type Batch struct {
	TS     float64 // the engine's clock, seconds since the epoch
	Events []Event
	// DPRank is the data-parallel rank of the engine that sent it, -1 when
	// the batch does not say.
	DPRank int
}

// Message is one published message: topic, sequence number and batch.
type Message struct {
	Topic string
	Seq   uint64
	Batch Batch
}

// Bounds of what a decoder accepts. A batch whose counts go past them is
// refused whole rather than cut.
const (
	// MaxBatchBytes bounds one msgpack batch: vLLM sends one per engine
	// step, a few KiB; a long prefill's tokens stay well inside.
	MaxBatchBytes = 8 << 20
	// MaxBlockSize is the largest block_size believed (vLLM allows up to
	// 256 tokens per block on some back ends).
	MaxBlockSize = 1024
	// MaxTokenID bounds a token id. An id is an opaque unsigned 32-bit
	// value: real vocabularies are far below it, but an engine may hash
	// words into ids (llm-d's vLLM simulator does, up to 2^32-1).
	MaxTokenID = 1<<32 - 1
)
