package adapter

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/subjects"
)

func TestPrefillRateIsLearnedBeyondTheBaseTTFT(t *testing.T) {
	var l loadState
	l.observePrefill(1000, 150*time.Millisecond) // no base seen yet: nothing learned
	if l.prefillRate != 0 {
		t.Fatalf("rate %v learned without a base TTFT", l.prefillRate)
	}
	l.observeTTFT(50 * time.Millisecond)
	l.observePrefill(1000, 150*time.Millisecond) // 1000 tokens in 100 ms beyond the base
	if l.prefillRate != 10000 {
		t.Fatalf("rate %v tokens/s, want 10000", l.prefillRate)
	}
	l.observePrefill(1000, 50*time.Millisecond)            // at the base: teaches nothing
	l.observePrefill(8, 1000*time.Millisecond)             // too short a prompt
	l.observePrefill(maxPromptTokens, 51*time.Millisecond) // absurdly fast: bounded
	want := 10000 + ttftAlpha*(subjects.MaxPrefillTokensPerSec-10000)
	if l.prefillRate > subjects.MaxPrefillTokensPerSec || l.prefillRate != want {
		t.Fatalf("rate %v, want %v", l.prefillRate, want)
	}
}

func TestQueuedPrefillCountsUntilTheFirstToken(t *testing.T) {
	var l loadState
	a := l.queuePrefill(promptTokens(nats.Header{subjects.HdrPromptTokens: {"700"}}))
	b := l.queuePrefill(promptTokens(nats.Header{subjects.HdrPromptTokens: {"300"}}))
	if n := l.queuedPrefill.Load(); n != 1000 {
		t.Fatalf("queued %d, want 1000", n)
	}
	a()
	a() // the call's end after its first token
	if n := l.queuedPrefill.Load(); n != 300 {
		t.Fatalf("queued %d after one first token, want 300", n)
	}
	b()
	if n := l.queuedPrefill.Load(); n != 0 {
		t.Fatalf("queued %d, want 0", n)
	}
	for _, v := range []string{"-5", "lots", ""} {
		if n := promptTokens(nats.Header{subjects.HdrPromptTokens: {v}}); n != 0 {
			t.Errorf("Llm-Prompt-Tokens %q counted %d", v, n)
		}
	}
	if n := promptTokens(nats.Header{subjects.HdrPromptTokens: {"999999999999"}}); n != maxPromptTokens {
		t.Errorf("a huge Llm-Prompt-Tokens counted %d, want the bound %d", n, maxPromptTokens)
	}
}
