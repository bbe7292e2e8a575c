package reply_test

import (
	"testing"

	"github.com/switchyard-llm/switchyard/subjects/reply"
)

func TestSequence(t *testing.T) {
	head := reply.Frame{Kind: reply.Head, Seq: 1}
	data := func(seq int) reply.Frame { return reply.Frame{Kind: reply.Data, Seq: seq} }
	end := func(seq int) reply.Frame { return reply.Frame{Kind: reply.End, Seq: seq, End: true} }
	tests := []struct {
		name     string
		accepted bool          // Accept is called before the frames
		frames   []reply.Frame // each in order but the last when !ok
		ok       bool
	}{
		{"head, data, end", true, []reply.Frame{head, data(2), data(3), end(4)}, true},
		{"the whole answer in the head", true, []reply.Frame{{Kind: reply.Head, Seq: 1, End: true}}, true},
		{"handover after the head", true, []reply.Frame{head, {Kind: reply.Handover, Seq: 2, End: true}}, true},
		{"nothing before the accept", false, []reply.Frame{head}, false},
		{"a data frame lost", true, []reply.Frame{head, data(2), data(4)}, false},
		{"the head lost", true, []reply.Frame{data(2)}, false},
		{"a frame repeated", true, []reply.Frame{head, data(2), data(2)}, false},
		{"the accept again", true, []reply.Frame{head, {Kind: reply.Accept, Seq: 0}}, false},
		{"no Llm-Seq", true, []reply.Frame{{Kind: reply.Head, Seq: -1}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s reply.Sequence
			if s.Accepted() {
				t.Fatal("the zero Sequence is accepted")
			}
			if tt.accepted {
				s.Accept()
				if !s.Accepted() {
					t.Fatal("not accepted after Accept")
				}
			}
			for i, f := range tt.frames {
				last := i == len(tt.frames)-1
				want := !last || tt.ok
				if got := s.Next(&f); got != want {
					t.Fatalf("frame %d (%s, seq %d): in order %v, want %v", i, f.Kind, f.Seq, got, want)
				}
			}
		})
	}
}

// TestSequenceAfterAGap: a frame out of order is not counted, so the one
// that was expected is still the one expected.
func TestSequenceAfterAGap(t *testing.T) {
	var s reply.Sequence
	s.Accept()
	if s.Next(&reply.Frame{Kind: reply.Data, Seq: 2}) {
		t.Fatal("data 2 before the head taken")
	}
	if !s.Next(&reply.Frame{Kind: reply.Head, Seq: 1}) {
		t.Fatal("the head, still expected, refused")
	}
}
