package kvevents_test

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/switchyard-llm/switchyard/internal/kvevents"
)

const (
	big    = kvevents.Hash(1<<64 - 12345) // above 2^63, as vLLM sends
	parent = kvevents.Hash(1<<63 + 77)
)

func tokens(from, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(from + i)
	}
	return t
}

func readBatch(t *testing.T, name string) (kvevents.Batch, int) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	batch, unknown, err := kvevents.DecodeBatch(b)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return batch, unknown
}

// The batches in testdata were written by the msgpack library in vLLM's
// shapes (testdata/gen.py), not by this package's encoder.
func TestDecodeArrayFormat(t *testing.T) {
	b, unknown := readBatch(t, "array-v0.9.bin")
	want := kvevents.Batch{TS: 1764612000.25, DPRank: 0, Events: []kvevents.Event{
		{Kind: kvevents.BlockStored, Hashes: []kvevents.Hash{big, 42}, TokenIDs: tokens(1000, 32), BlockSize: 16, Medium: "GPU"},
		{Kind: kvevents.BlockStored, Hashes: []kvevents.Hash{7}, Parent: big, HasParent: true, TokenIDs: tokens(0, 16), BlockSize: 16, Medium: "GPU"},
		{Kind: kvevents.BlockRemoved, Hashes: []kvevents.Hash{42}, Medium: "GPU"},
		{Kind: kvevents.AllBlocksCleared},
	}}
	checkBatch(t, b, want)
	if unknown != 0 {
		t.Errorf("unknown = %d, want 0", unknown)
	}
}

func TestDecodeMapFormat(t *testing.T) {
	b, unknown := readBatch(t, "map-v0.12.bin")
	want := kvevents.Batch{TS: 1764612001.5, DPRank: -1, Events: []kvevents.Event{
		{Kind: kvevents.BlockStored, Hashes: []kvevents.Hash{big, 42}, Parent: parent, HasParent: true,
			TokenIDs: tokens(1000, 32), BlockSize: 16, Medium: "GPU", LoraName: "sql-lora"},
		{Kind: kvevents.BlockRemoved, Hashes: []kvevents.Hash{big}, Medium: "GPU"},
		{Kind: kvevents.AllBlocksCleared},
	}}
	checkBatch(t, b, want)
	if unknown != 1 {
		t.Errorf("unknown = %d, want 1 (BlockOffloaded)", unknown)
	}
}

func TestDecodeByteHashes(t *testing.T) {
	b, _ := readBatch(t, "bytes-hashes.bin")
	h1, h2 := sha256.Sum256([]byte("block-1")), sha256.Sum256([]byte("block-2"))
	f1, f2 := kvevents.FoldBytes(h1[:]), kvevents.FoldBytes(h2[:])
	want := kvevents.Batch{TS: 1764612002, DPRank: 3, Events: []kvevents.Event{
		{Kind: kvevents.BlockStored, Hashes: []kvevents.Hash{f1, f2}, TokenIDs: tokens(1000, 32), BlockSize: 16, Medium: "GPU"},
		{Kind: kvevents.BlockRemoved, Hashes: []kvevents.Hash{f2}, Medium: "GPU"},
	}}
	checkBatch(t, b, want)
}

func checkBatch(t *testing.T, got, want kvevents.Batch) {
	t.Helper()
	if got.TS != want.TS || got.DPRank != want.DPRank || len(got.Events) != len(want.Events) {
		t.Fatalf("batch = ts %v rank %d %d events, want ts %v rank %d %d events",
			got.TS, got.DPRank, len(got.Events), want.TS, want.DPRank, len(want.Events))
	}
	for i, g := range got.Events {
		w := want.Events[i]
		if g.Kind != w.Kind || !slices.Equal(g.Hashes, w.Hashes) || g.Parent != w.Parent || g.HasParent != w.HasParent ||
			!slices.Equal(g.TokenIDs, w.TokenIDs) || g.BlockSize != w.BlockSize || g.Medium != w.Medium ||
			g.LoraName != w.LoraName || g.LoraID != w.LoraID {
			t.Errorf("event %d = %+v\nwant %+v", i, g, w)
		}
	}
}

// Both encodings of this package's encoder decode to what was encoded.
func TestEncodeRoundTrip(t *testing.T) {
	in := kvevents.Batch{TS: 12.5, DPRank: 1, Events: []kvevents.Event{
		{Kind: kvevents.BlockStored, Hashes: []kvevents.Hash{big, 1}, TokenIDs: tokens(5, 8), BlockSize: 4, Medium: "GPU"},
		{Kind: kvevents.BlockStored, Hashes: []kvevents.Hash{3}, Parent: 1, HasParent: true, TokenIDs: tokens(9, 4), BlockSize: 4, LoraID: 2, LoraName: "a"},
		{Kind: kvevents.BlockRemoved, Hashes: []kvevents.Hash{big}},
		{Kind: kvevents.AllBlocksCleared},
	}}
	for _, f := range []kvevents.Format{kvevents.FormatArray, kvevents.FormatMap} {
		t.Run(string(f), func(t *testing.T) {
			out, unknown, err := kvevents.DecodeBatch(kvevents.AppendBatch(nil, &in, f))
			if err != nil || unknown != 0 {
				t.Fatalf("decode: %v (unknown %d)", err, unknown)
			}
			checkBatch(t, out, in)
		})
	}
}

func pack(t *testing.T, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// What a broken or hostile engine might send is refused with the error
// that says why, never a panic and never half a batch.
func TestDecodeRefuses(t *testing.T) {
	stored := func(members ...any) any {
		return []any{1.0, []any{append([]any{"BlockStored"}, members...)}, 0}
	}
	cases := []struct {
		name string
		v    any
		want error
	}{
		{"not a batch", "hello", kvevents.ErrMalformed},
		{"short batch", []any{1.0}, kvevents.ErrMalformed},
		{"map without events", map[string]any{"ts": 1.0}, kvevents.ErrMalformed},
		{"event not a container", []any{1.0, []any{7}, 0}, kvevents.ErrMalformed},
		{"event without type", []any{1.0, []any{map[string]any{"block_hashes": []any{1}}}, 0}, kvevents.ErrMalformed},
		{"stored without block_size", stored([]any{uint64(1)}, nil, tokens(0, 16)), kvevents.ErrMalformed},
		{"nil block hash", stored([]any{nil}, nil, tokens(0, 16), 16), kvevents.ErrMalformed},
		{"float hash", stored([]any{1.5}, nil, tokens(0, 16), 16), kvevents.ErrMalformed},
		{"negative token", stored([]any{uint64(1)}, nil, []any{-1}, 1), kvevents.ErrRange},
		{"token past 32 bits", stored([]any{uint64(1)}, nil, []any{uint64(1) << 32}, 1), kvevents.ErrRange},
		{"huge token", stored([]any{uint64(1)}, nil, []any{uint64(1) << 40}, 1), kvevents.ErrRange},
		{"block size zero", stored([]any{uint64(1)}, nil, []any{}, 0), kvevents.ErrRange},
		{"block size huge", stored([]any{uint64(1)}, nil, []any{1}, 1<<20), kvevents.ErrRange},
		{"tokens not a block per hash", stored([]any{uint64(1), uint64(2)}, nil, tokens(0, 16), 16), kvevents.ErrRange},
		{"hash of 100 bytes", stored([]any{make([]byte, 100)}, nil, []any{1}, 1), kvevents.ErrRange},
		{"negative dp rank", []any{1.0, []any{}, -2}, kvevents.ErrRange},
		{"string ts", []any{"now", []any{}, 0}, kvevents.ErrMalformed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, unknown, err := kvevents.DecodeBatch(pack(t, c.v))
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			if len(b.Events) != 0 || unknown != 0 {
				t.Errorf("a refused batch returned %d events, %d unknown", len(b.Events), unknown)
			}
		})
	}
	t.Run("trailing bytes", func(t *testing.T) {
		b := append(pack(t, []any{1.0, []any{}, 0}), 0xc0)
		if _, _, err := kvevents.DecodeBatch(b); !errors.Is(err, kvevents.ErrMalformed) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("array longer than its bytes", func(t *testing.T) {
		b := []byte{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff}
		if _, _, err := kvevents.DecodeBatch(b); !errors.Is(err, kvevents.ErrMalformed) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("deep nesting in an unknown member", func(t *testing.T) {
		deep := []byte{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x92, 0xa8}
		deep = append(deep, "Whatever"...)
		for range 10000 {
			deep = append(deep, 0x91)
		}
		deep = append(deep, 0xc0, 0xc0)
		if _, _, err := kvevents.DecodeBatch(deep); !errors.Is(err, kvevents.ErrMalformed) {
			t.Fatalf("err = %v", err)
		}
	})
}

// A token id is an opaque unsigned 32-bit value: engines that hash words
// into ids (llm-d's vLLM simulator) send ids up to 2^32-1, in msgpack's
// uint32 encoding.
func TestDecodeTokenIDsUseAll32Bits(t *testing.T) {
	ids := []any{uint32(0), uint32(1) << 31, uint32(1<<32 - 1), uint32(3_000_000_000)}
	v := []any{1.0, []any{[]any{"BlockStored", []any{uint64(9)}, nil, ids, 4}}, 0}
	b, _, err := kvevents.DecodeBatch(pack(t, v))
	if err != nil {
		t.Fatal(err)
	}
	want := []uint32{0, 1 << 31, 1<<32 - 1, 3_000_000_000}
	if len(b.Events) != 1 || !slices.Equal(b.Events[0].TokenIDs, want) {
		t.Fatalf("events = %+v, want token ids %v", b.Events, want)
	}
}

// Refusal names each refusal apart, for the adapter's reason label.
func TestRefusalNamesTheReason(t *testing.T) {
	stored := func(members ...any) []byte {
		return pack(t, []any{1.0, []any{append([]any{"BlockStored"}, members...)}, 0})
	}
	cases := []struct {
		name string
		b    []byte
		want string
	}{
		{"token past 32 bits", stored([]any{uint64(1)}, nil, []any{uint64(1) << 32}, 1), kvevents.RefusedTokenID},
		{"token past 63 bits", stored([]any{uint64(1)}, nil, []any{uint64(1) << 63}, 1), kvevents.RefusedTokenID},
		{"negative token", stored([]any{uint64(1)}, nil, []any{-5}, 1), kvevents.RefusedTokenID},
		{"block size zero", stored([]any{uint64(1)}, nil, []any{}, 0), kvevents.RefusedBlockSize},
		{"block size huge", stored([]any{uint64(1)}, nil, []any{1}, 1<<20), kvevents.RefusedBlockSize},
		{"tokens not a block per hash", stored([]any{uint64(1), uint64(2)}, nil, []any{1, 2}, 2), kvevents.RefusedTokenCount},
		{"hash of 100 bytes", stored([]any{make([]byte, 100)}, nil, []any{1}, 1), kvevents.RefusedRange},
		{"not a batch", pack(t, "hello"), kvevents.RefusedShape},
		{"too large", make([]byte, kvevents.MaxBatchBytes+1), kvevents.RefusedTooLarge},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := kvevents.DecodeBatch(c.b)
			if err == nil {
				t.Fatal("refused nothing")
			}
			if got := kvevents.Refusal(err); got != c.want {
				t.Errorf("Refusal(%v) = %q, want %q", err, got, c.want)
			}
		})
	}
}

func TestDecodeMessage(t *testing.T) {
	payload := kvevents.AppendBatch(nil, &kvevents.Batch{TS: 1, DPRank: 0, Events: []kvevents.Event{{Kind: kvevents.AllBlocksCleared}}}, kvevents.FormatArray)
	m, _, err := kvevents.DecodeMessage([][]byte{[]byte("kv-events"), kvevents.SeqFrame(1<<40 + 3), payload})
	if err != nil {
		t.Fatal(err)
	}
	if m.Topic != "kv-events" || m.Seq != 1<<40+3 || len(m.Batch.Events) != 1 {
		t.Errorf("message = %+v", m)
	}
	for _, frames := range [][][]byte{
		{[]byte("kv-events"), payload},
		{[]byte("kv-events"), []byte{0, 1}, payload},
	} {
		if _, _, err := kvevents.DecodeMessage(frames); !errors.Is(err, kvevents.ErrMalformed) {
			t.Errorf("%d frames: err = %v", len(frames), err)
		}
	}
}

// llm-d's vLLM simulator hashes words into 32-bit token ids, most of them
// above 2^31, and in its array encoding sends a parent hash of 0 for a
// chain's first block (nil in its map encoding). Its captured events
// (testdata/SOURCES.md) decode whole, their token ids the ones its
// /tokenize gave for the same prompt.
func TestDecodeLLMDSimulatorCaptures(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "llm-d-sim-tokenize.json"))
	if err != nil {
		t.Fatal(err)
	}
	var tok struct{ Tokens []uint32 }
	if err := json.Unmarshal(raw, &tok); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		file      string
		hasParent bool
	}{{"llm-d-sim-array.bin", true}, {"llm-d-sim-map.bin", false}} {
		t.Run(c.file, func(t *testing.T) {
			b, _ := readBatch(t, c.file)
			if len(b.Events) != 1 {
				t.Fatalf("%d events, want 1", len(b.Events))
			}
			ev := b.Events[0]
			if ev.Kind != kvevents.BlockStored || len(ev.Hashes) != 6 || ev.BlockSize != 16 || ev.HasParent != c.hasParent || ev.Parent != 0 {
				t.Fatalf("event %v: %d hashes, block size %d, parent %v/%d", ev.Kind, len(ev.Hashes), ev.BlockSize, ev.HasParent, ev.Parent)
			}
			if !slices.Equal(ev.TokenIDs, tok.Tokens[:96]) {
				t.Errorf("token ids are not the first 6 blocks of /tokenize's")
			}
			if !slices.ContainsFunc(ev.TokenIDs, func(id uint32) bool { return id >= 1<<31 }) {
				t.Errorf("no token id at or above 2^31: the capture does not test the range")
			}
		})
	}
}
