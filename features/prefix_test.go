package features_test

import (
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/switchyard-llm/switchyard/features"
)

func TestAppendPrefix(t *testing.T) {
	a := []byte(strings.Repeat("A", 16) + strings.Repeat("B", 16) + strings.Repeat("C", 16) + "tail")
	h0 := xxhash.Sum64(a[:16])
	var buf [8]byte
	binary.LittleEndian.PutUint64(buf[:], h0)
	h1 := xxhash.Sum64(append(buf[:], a[16:32]...))
	tests := []struct {
		name              string
		prompt            []byte
		blockChars, max   int
		wantLen           int
		wantFirst, wantSc uint64
	}{
		{"whole blocks only", a, 16, 64, 3, h0, h1},
		{"capped at max blocks", a, 16, 2, 2, h0, h1},
		{"shorter than a block", a[:15], 16, 64, 0, 0, 0},
		{"zero max blocks", a, 16, 0, 0, 0, 0},
		{"zero block size", a, 0, 64, 0, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := features.AppendPrefix(nil, tc.prompt, tc.blockChars, tc.max)
			if len(got) != tc.wantLen {
				t.Fatalf("%d blocks, want %d", len(got), tc.wantLen)
			}
			if tc.wantLen >= 2 && (got[0] != tc.wantFirst || got[1] != tc.wantSc) {
				t.Fatalf("hashes %x, want %x %x", got, tc.wantFirst, tc.wantSc)
			}
		})
	}
}

func TestAppendPrefixChains(t *testing.T) {
	base := []byte(strings.Repeat("system prompt ", 40))
	x := append(slices.Clone(base), strings.Repeat("question one ", 20)...)
	y := append(slices.Clone(base), strings.Repeat("question two ", 20)...)
	hx := features.AppendPrefix(nil, x, 64, 64)
	hy := features.AppendPrefix(nil, y, 64, 64)
	shared := len(base) / 64
	if !slices.Equal(hx[:shared], hy[:shared]) {
		t.Fatal("equal prefixes hash differently")
	}
	for i := shared + 1; i < min(len(hx), len(hy)); i++ {
		if hx[i] == hy[i] {
			t.Fatalf("block %d equal after the prompts diverged", i)
		}
	}
	// The same block at another position hashes differently: the chain names
	// the whole prefix, not the block.
	rep := features.AppendPrefix(nil, []byte(strings.Repeat("z", 128)), 64, 2)
	if rep[0] == rep[1] {
		t.Fatal("repeated block did not chain")
	}
}

func TestPrefixHeader(t *testing.T) {
	blocks := []uint64{0, 1, 0xdeadbeef, ^uint64(0)}
	s := features.FormatPrefixHeader(blocks)
	if s != "0,1,deadbeef,ffffffffffffffff" {
		t.Fatalf("format %q", s)
	}
	if string(features.AppendPrefixHeader(nil, blocks)) != s {
		t.Fatal("AppendPrefixHeader differs from FormatPrefixHeader")
	}
	tests := []struct {
		name string
		in   string
		want []uint64
		err  bool
	}{
		{"round trip", s, blocks, false},
		{"empty", "", nil, false},
		{"blank", "  ", nil, false},
		{"upper case and spaces", " DEADBEEF , 0a", []uint64{0xdeadbeef, 10}, false},
		{"leading zeros", "0000000000000001", []uint64{1}, false},
		{"empty item", "1,,2", nil, true},
		{"trailing comma", "1,", nil, true},
		{"not hex", "xyz", nil, true},
		{"signed", "+1", nil, true},
		{"0x prefix", "0x1", nil, true},
		{"underscore", "de_ad", nil, true},
		{"too long", "10000000000000000", nil, true},
		{"too many", strings.Repeat("1,", features.MaxPrefixBlocks) + "1", nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := features.ParsePrefixHeader(nil, tc.in)
			if tc.err {
				if !errors.Is(err, features.ErrPrefixHeader) {
					t.Fatalf("err = %v, want ErrPrefixHeader", err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("got %x, %v; want %x", got, err, tc.want)
			}
		})
	}
}

func TestParsePrefixHeaderNoAllocs(t *testing.T) {
	v := features.FormatPrefixHeader(features.AppendPrefix(nil, []byte(strings.Repeat("abcd", 4096)), 256, 64))
	dst := make([]uint64, 0, 64)
	allocs := testing.AllocsPerRun(100, func() {
		var err error
		if dst, err = features.ParsePrefixHeader(dst[:0], v); err != nil || len(dst) != 64 {
			t.Fatal(err, len(dst))
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocs per parse", allocs)
	}
	p := []byte(strings.Repeat("abcd", 4096))
	if a := testing.AllocsPerRun(100, func() { dst = features.AppendPrefix(dst[:0], p, 256, 64) }); a != 0 {
		t.Fatalf("AppendPrefix: %v allocs", a)
	}
}

func FuzzPrefixHeader(f *testing.F) {
	for _, s := range []string{"", "0", "1,2,3", "deadbeef,FFFFFFFFFFFFFFFF", " a , b ", "1,,2", "g", "10000000000000000"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := features.ParsePrefixHeader(nil, s)
		if err != nil {
			if !errors.Is(err, features.ErrPrefixHeader) {
				t.Fatalf("error %v does not wrap ErrPrefixHeader", err)
			}
			return
		}
		if len(got) > features.MaxPrefixBlocks {
			t.Fatalf("%d blocks", len(got))
		}
		again, err := features.ParsePrefixHeader(nil, features.FormatPrefixHeader(got))
		if err != nil || !slices.Equal(again, got) {
			t.Fatalf("round trip of %q: %x, %v; want %x", s, again, err, got)
		}
	})
}

var sinkBlocks []uint64

func BenchmarkAppendPrefix(b *testing.B) {
	p := []byte(strings.Repeat("a canonical prompt ", 1000))
	dst := make([]uint64, 0, 64)
	b.SetBytes(int64(min(len(p), 64*256)))
	b.ReportAllocs()
	for b.Loop() {
		dst = features.AppendPrefix(dst[:0], p, 256, 64)
	}
	sinkBlocks = dst
}

func BenchmarkParsePrefixHeader(b *testing.B) {
	v := features.FormatPrefixHeader(features.AppendPrefix(nil, []byte(strings.Repeat("abcd", 4096)), 256, 64))
	dst := make([]uint64, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		dst, _ = features.ParsePrefixHeader(dst[:0], v)
	}
	sinkBlocks = dst
}
