package lab_test

import (
	"bytes"
	"testing"

	"github.com/switchyard-llm/switchyard/lab"
)

// Equal hash ids give byte-equal text, in every call: two prompts share
// their text exactly as far as they share their ids, and a prompt is its
// blocks in order, cut to its input length.
func TestTraceTextIsItsBlocks(t *testing.T) {
	const bt = 8
	a := lab.TraceRecord{Input: 3*bt + 5, Hashes: []uint64{7, 8, 9, 10}}
	b := lab.TraceRecord{Input: 3 * bt, Hashes: []uint64{7, 8, 11}}
	ta, tb := lab.TraceText(nil, &a, bt, 1), lab.TraceText(nil, &b, bt, 2)
	if len(ta) != 4*a.Input || len(tb) != 4*b.Input {
		t.Fatalf("lengths %d and %d, want four bytes a token: %d and %d", len(ta), len(tb), 4*a.Input, 4*b.Input)
	}
	shared := 0
	for shared < len(tb) && ta[shared] == tb[shared] {
		shared++
	}
	// Two blocks shared; the third differs (the first word of 9 and 11
	// may agree by chance, not a whole block).
	if shared < 2*bt*4 || shared >= 3*bt*4 {
		t.Errorf("the prompts share %d bytes, want the two shared blocks' %d and less than a third block", shared, 2*bt*4)
	}
	if again := lab.TraceText(nil, &a, bt, 1); !bytes.Equal(again, ta) {
		t.Error("the same record gave different text")
	}
	// A block's text does not depend on the block's place or neighbours.
	c := lab.TraceRecord{Input: bt, Hashes: []uint64{9}}
	if tc := lab.TraceText(nil, &c, bt, 3); !bytes.Equal(tc, ta[2*bt*4:3*bt*4]) {
		t.Error("hash id 9 alone differs from hash id 9 in third place")
	}
	// Tokens past the last hash id are the request's own.
	long1 := lab.TraceRecord{Input: 2 * bt, Hashes: []uint64{7}}
	x, y := lab.TraceText(nil, &long1, bt, 1), lab.TraceText(nil, &long1, bt, 2)
	if !bytes.Equal(x[:bt*4], y[:bt*4]) || bytes.Equal(x[bt*4:], y[bt*4:]) {
		t.Error("the tail past the hash ids is not the request's own")
	}
	for _, ch := range ta {
		if ch != ' ' && (ch < 'a' || ch > 'z') {
			t.Fatalf("byte %q: want spaces and lowercase letters only", ch)
		}
	}
}
