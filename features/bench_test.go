package features

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
)

// chatBody is a chat request of at least n bytes the way long-context
// traffic looks: a short system message, then a pasted document of prose
// paragraphs (lines escaped as \n), then the question.
func chatBody(n int) []byte {
	sentences := []string{
		"The router reads the headers and never the body. ",
		"Each replica reports its queue depth and KV-cache use every second. ",
		"Prefix affinity sends a conversation back to the replica that holds its cache, ",
		"unless that replica is saturated, in which case the power of two choices decides. ",
		"Quotas are reserved at admission and settled from the usage the adapter reports. ",
		"A canary receives a sticky share of the conversations named by the table.",
	}
	var b strings.Builder
	b.Grow(n + 256)
	b.WriteString(`{"model":"chat-large","stream":true,"max_tokens":256,"messages":[` +
		`{"role":"system","content":"You are a careful assistant. Answer from the document."},` +
		`{"role":"user","content":"Here is the document:\n\n`)
	for i := 0; b.Len() < n; i++ {
		b.WriteString(sentences[i%len(sentences)])
		if i%7 == 6 {
			b.WriteString(`\n\n`)
		}
	}
	b.WriteString(`\n\nWhat does the router read?"}]}`)
	return []byte(b.String())
}

var sinkRequest Request

// BenchmarkParseChat is the gateway's feature extraction of a chat body:
// parse, token estimate, chained prefix hashes (the dev table's 256-byte
// blocks, 64 of them) and flags, into reused buffers as the gateway does.
func BenchmarkParseChat(b *testing.B) {
	small := []byte(`{"model":"chat-large","stream":true,"max_tokens":256,"messages":[` +
		`{"role":"system","content":"` + strings.Repeat("You are a helpful assistant. ", 40) + `"},` +
		`{"role":"user","content":"` + strings.Repeat("Tell me about routing. ", 20) + `"}]}`)
	cases := []struct {
		name string
		body []byte
	}{{"1.7KB", small}}
	for _, kb := range []int{64, 256, 480} {
		cases = append(cases, struct {
			name string
			body []byte
		}{fmt.Sprintf("%dKB", kb), chatBody(kb << 10)})
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			var blocks [MaxPrefixBlocks]uint64
			_ = ParseRequestInto(&sinkRequest, subjects.EndpointChat, c.body) // size the prompt buffer
			b.SetBytes(int64(len(c.body)))
			b.ReportAllocs()
			cpu := startCPU()
			for b.Loop() {
				if err := ParseRequestInto(&sinkRequest, subjects.EndpointChat, c.body); err != nil {
					b.Fatal(err)
				}
				prefix := AppendPrefix(blocks[:0], sinkRequest.Prompt, 256, 64)
				if len(prefix) == 0 || sinkRequest.PromptTokens == 0 {
					b.Fatal("no features")
				}
				_ = Flags(sinkRequest.Prompt)
			}
			cpu.report(b, len(c.body))
		})
	}
}

// BenchmarkParseChatReference is the same work through the encoding/json
// parser the scanner replaced, for comparison in one run.
func BenchmarkParseChatReference(b *testing.B) {
	for _, kb := range []int{64, 256} {
		body := chatBody(kb << 10)
		b.Run(fmt.Sprintf("%dKB", kb), func(b *testing.B) {
			var blocks [MaxPrefixBlocks]uint64
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			cpu := startCPU()
			for b.Loop() {
				if err := refParseRequestInto(&sinkRequest, subjects.EndpointChat, body); err != nil {
					b.Fatal(err)
				}
				_ = AppendPrefix(blocks[:0], sinkRequest.Prompt, 256, 64)
				_ = refIsCode(sinkRequest.Prompt)
			}
			cpu.report(b, len(body))
		})
	}
}

// cpuClock reads the process's CPU time (user + system) around a benchmark
// loop. On a shared machine the wall clock ns/op counts the time other
// processes held the cores; MB/cpu-s is the throughput on the CPU the loop
// actually got.
type cpuClock struct{ start time.Duration }

func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func startCPU() cpuClock { return cpuClock{start: processCPU()} }

func (c cpuClock) report(b *testing.B, size int) {
	d := processCPU() - c.start
	if d > 0 && c.start > 0 {
		b.ReportMetric(float64(size)*float64(b.N)/d.Seconds()/1e6, "MB/cpu-s")
	}
}
