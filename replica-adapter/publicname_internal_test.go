package adapter

import (
	"bytes"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"testing/iotest"
)

// cutReader returns src in random cuts, as a network read does.
type cutReader struct {
	src []byte
	rng *rand.Rand
}

func (c *cutReader) Read(p []byte) (int, error) {
	if len(c.src) == 0 {
		return 0, io.EOF
	}
	n := min(len(c.src), len(p), 1+c.rng.IntN(48))
	copy(p, c.src[:n])
	c.src = c.src[n:]
	return n, nil
}

func TestRenamerRewritesTheModelInEveryCut(t *testing.T) {
	for _, tt := range []struct{ file, served, public string }{
		{"testdata/vllm/chat-stream-lora.sse", "lora-a", "chat-small:team-x-v3"},
		{"testdata/vllm/chat-completion.json", "sim-model", "chat-small"},
	} {
		in, err := os.ReadFile(tt.file)
		if err != nil {
			t.Fatal(err)
		}
		want := bytes.ReplaceAll(in, []byte(`"model":"`+tt.served+`"`), []byte(`"model":"`+tt.public+`"`))
		want = bytes.ReplaceAll(want, []byte(`"model": "`+tt.served+`"`), []byte(`"model": "`+tt.public+`"`))
		if bytes.Equal(want, in) {
			t.Fatalf("%s: nothing to rename", tt.file)
		}
		for seed := range uint64(50) {
			r := newRenamer(io.NopCloser(&cutReader{src: in, rng: rand.New(rand.NewPCG(seed, 1))}), tt.served, tt.public)
			got, err := io.ReadAll(r)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("%s seed %d: err %v\n got %s\nwant %s", tt.file, seed, err, got, want)
			}
		}
		got, err := io.ReadAll(newRenamer(io.NopCloser(iotest.OneByteReader(bytes.NewReader(in))), tt.served, tt.public))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s one byte at a time: %v", tt.file, err)
		}
	}
}

// TestRenamerPassesAWholeEventOn: an SSE event read whole comes out whole,
// nothing held back for the next read.
func TestRenamerPassesAWholeEventOn(t *testing.T) {
	ev := []byte("data: {\"id\":\"x\",\"model\":\"lora-a\",\"choices\":[]}\n\n")
	pr, pw := io.Pipe()
	r := newRenamer(pr, "lora-a", "m:lora")
	go func() { _, _ = pw.Write(ev) }()
	buf := make([]byte, 1024)
	n, err := r.Read(buf)
	if err != nil || string(buf[:n]) != "data: {\"id\":\"x\",\"model\":\"m:lora\",\"choices\":[]}\n\n" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	pw.Close()
}

// eventReader returns one SSE event a read, as an engine flushes a stream.
type eventReader struct{ events [][]byte }

func (e *eventReader) Read(p []byte) (int, error) {
	if len(e.events) == 0 {
		return 0, io.EOF
	}
	n := copy(p, e.events[0])
	if e.events[0] = e.events[0][n:]; len(e.events[0]) == 0 {
		e.events = e.events[1:]
	}
	return n, nil
}

// BenchmarkRenamerStream is the rename of a streamed answer, every event
// of which names the model: the per-chunk cost of answering with the name
// the client asked for.
func BenchmarkRenamerStream(b *testing.B) {
	in, err := os.ReadFile("testdata/vllm/chat-stream-lora.sse")
	if err != nil {
		b.Fatal(err)
	}
	events := bytes.SplitAfter(in, []byte("\n\n"))
	buf := make([]byte, sseChunkSize)
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for b.Loop() {
		r := newRenamer(io.NopCloser(&eventReader{events: slices.Clone(events)}), "lora-a", "chat-small:team-x-v3")
		for {
			if _, err := r.Read(buf); err != nil {
				break
			}
		}
	}
}
