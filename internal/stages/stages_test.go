package stages_test

import (
	"testing"

	"github.com/switchyard-llm/switchyard/internal/stages"
)

func TestNilRecorderRecordsNothing(t *testing.T) {
	var r *stages.Recorder
	r.Begin("a", r.Now())
	r.Mark("a", stages.Published)
	r.End("a")
	if r.Sampled("a") || r.Now() != 0 || r.Summary().Requests != 0 {
		t.Fatal("a nil recorder recorded something")
	}
}

func TestSummaryIsTheTimeBetweenStagesPassed(t *testing.T) {
	r := stages.New(1)
	for _, id := range []string{"a", "b"} {
		r.Begin(id, r.Now())
		for _, s := range []stages.Stage{stages.Published, stages.Decided, stages.AdapterReceived, stages.ClientFirstByte} {
			r.Mark(id, s)
		}
		r.Mark(id, stages.Published) // a retry's second publish is not counted
		r.End(id)
	}
	r.Begin("refused", r.Now())
	r.Mark("refused", stages.Published)
	r.End("refused") // never reached the client: dropped
	r.Mark("never-begun", stages.Published)

	sum := r.Summary()
	if sum.Requests != 2 {
		t.Fatalf("requests = %d, want 2", sum.Requests)
	}
	var got []string
	for _, st := range sum.Stages {
		got = append(got, st.Stage)
		if st.Requests != 2 || st.P50 < 0 || st.P99 < st.P50 {
			t.Errorf("%s: %+v", st.Stage, st)
		}
	}
	want := []string{"gateway published", "decided", "adapter received", "first byte written to the client"}
	if len(got) != len(want) {
		t.Fatalf("stages %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("stages %q, want %q", got, want)
		}
	}
	if sum.Total.P50 <= 0 {
		t.Errorf("total %+v", sum.Total)
	}
	r.Reset()
	if n := r.Summary().Requests; n != 0 {
		t.Errorf("after Reset: %d requests", n)
	}
}

func TestSamplingOneInEvery(t *testing.T) {
	r := stages.New(4)
	sampled := 0
	for i := range 100 {
		id := string(rune('A' + i))
		r.Begin(id, r.Now())
		if r.Sampled(id) {
			sampled++
		}
		r.Mark(id, stages.ClientFirstByte)
		r.End(id)
	}
	if sampled != 25 || r.Summary().Requests != 25 {
		t.Fatalf("sampled %d, summarised %d; want 25 of 100", sampled, r.Summary().Requests)
	}
}

// BenchmarkMark shows what the path pays: off (a nil recorder), on for a
// request not sampled, on for one sampled.
func BenchmarkMark(b *testing.B) {
	b.Run("off", func(b *testing.B) {
		var r *stages.Recorder
		b.ReportAllocs()
		for b.Loop() {
			r.Mark("req", stages.Published)
		}
	})
	b.Run("on/not-sampled", func(b *testing.B) {
		r := stages.New(1)
		b.ReportAllocs()
		for b.Loop() {
			r.Mark("req", stages.Published)
		}
	})
	b.Run("on/sampled", func(b *testing.B) {
		r := stages.New(1)
		r.Begin("req", r.Now())
		b.ReportAllocs()
		for b.Loop() {
			r.Mark("req", stages.Published)
		}
	})
}
