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

func TestPrefillRateWithNoFreshSamplesDecaysTowardItsPeak(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	var l loadState
	l.observeTTFTAt(50*time.Millisecond, t0)
	l.observePrefillAt(1000, 150*time.Millisecond, t0) // 10,000 tokens/s unloaded
	for range 30 {
		// A burst: the same prompts take seconds, and teach a slow rate.
		l.observePrefillAt(1000, 2050*time.Millisecond, t0)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	slow := l.prefillRateLocked(t0)
	if slow > 700 {
		t.Fatalf("rate %v after the burst, want near 500 tokens/s", slow)
	}
	// Nothing is sent to a replica that looks this slow: without decay
	// it would stay slow. One half-life halves the gap to the peak.
	half := l.prefillRateLocked(t0.Add(waitHalfLife))
	if want := 10000 - (10000-slow)/2; half < want-1 || half > want+1 {
		t.Fatalf("rate %v after one half-life, want %v", half, want)
	}
	if rest := l.prefillRateLocked(t0.Add(20 * waitHalfLife)); rest < 9990 || rest > 10000 {
		t.Fatalf("rate %v long after, want back at the peak 10000 and never past it", rest)
	}
}
