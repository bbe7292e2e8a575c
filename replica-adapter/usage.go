package adapter

import (
	"bytes"

	"github.com/switchyard-llm/switchyard/internal/chunk"
	"github.com/switchyard-llm/switchyard/internal/jsonscan"
	"github.com/switchyard-llm/switchyard/internal/sse"
)

const (
	// usageWindow is how much of each end of a non-streamed body is kept to
	// find "usage": engines put it first (vLLM) or last (OpenAI), and an
	// embeddings body can be far larger than both ends together.
	usageWindow = 64 << 10
)

// tokens is the engine's usage object.
type tokens struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	// Cached is the prompt tokens the engine's prefix cache served, as its
	// usage said (0 when it did not say).
	Cached int `json:"-"`
}

// usageScanner finds the engine's token usage in a response while it streams
// past, without holding the response: in a stream, the last data event with
// a usage object (stream_options.include_usage); in a JSON body, its usage
// object.
type usageScanner struct {
	sse   bool
	found bool
	usage tokens
	// events counts SSE data events, the estimate of completion tokens when
	// the engine reports no usage (one token per chunk, as vLLM streams).
	events int

	split sse.Events // SSE: the event not yet ended
	head  []byte     // JSON: the first usageWindow bytes
	tail  []byte     // JSON: at least the last usageWindow bytes
	total int

	// The prompt tokens the engine's prefix cache served, when its
	// usage says (Cached).
	cached    int
	hasCached bool

	// observe, if set, sees every byte first (the owner recorder).
	observe func(p []byte)
}

func (u *usageScanner) Write(p []byte) {
	if u.observe != nil {
		u.observe(p)
	}
	if u.sse {
		u.writeSSE(p)
		return
	}
	u.total += len(p)
	if n := min(len(p), usageWindow-len(u.head)); n > 0 {
		u.head = append(u.head, p[:n]...)
	}
	if len(p) >= usageWindow {
		// The body's last usageWindow bytes are all in p: a non-streamed
		// answer arrives in one write, and is not copied whole.
		u.tail = append(u.tail[:0], p[len(p)-usageWindow:]...)
		return
	}
	u.tail = append(u.tail, p...)
	if len(u.tail) > 2*usageWindow {
		u.tail = append(u.tail[:0], u.tail[len(u.tail)-usageWindow:]...)
	}
}

func (u *usageScanner) writeSSE(p []byte) {
	// Only watching: an event over the bound (sse.MaxEvent) is skipped, not
	// buffered, and the events after it still count.
	u.split.SkipOversized = true
	_ = u.split.Write(p, u.sseEvent)
}

func (u *usageScanner) sseEvent(ev []byte) error {
	data := bytes.TrimSpace(sse.Data(ev))
	if len(data) == 0 || bytes.Equal(data, []byte("[DONE]")) {
		return nil
	}
	u.events++
	if t, hasPrompt, ok := findUsage(data); ok {
		if !hasPrompt && u.found {
			t.PromptTokens = u.usage.PromptTokens // message_start had it
		}
		u.usage, u.found = t.tokens, true
		if t.HasCached {
			u.cached, u.hasCached = t.CachedTokens, true
		}
	}
	return nil
}

// Finish returns the usage found, if any.
func (u *usageScanner) Finish() (tokens, bool) {
	if u.sse {
		_ = u.split.End(u.sseEvent) // the last event, perhaps without its blank line
		return u.usage, u.found
	}
	if u.total > len(u.head) {
		if t, _, ok := findUsage(u.tail); ok {
			u.cached, u.hasCached = t.CachedTokens, t.HasCached
			return t.tokens, true
		}
	}
	t, _, ok := findUsage(u.head)
	u.cached, u.hasCached = t.CachedTokens, t.HasCached
	return t.tokens, ok
}

// Cached is how many prompt tokens the engine's prefix cache served, as
// the usage Finish found says, when it says.
func (u *usageScanner) Cached() (int, bool) { return u.cached, u.hasCached }

// findUsage decodes the last "usage" object in b. It looks for the key
// rather than decoding b: b may be a cut window of a larger body, and a
// "usage" inside a string value is escaped (\"usage\") so it cannot match.
func findUsage(b []byte) (t usage, hasPrompt, ok bool) {
	for end := len(b); end > 0; {
		i, j := jsonscan.LastMember(b, `"usage"`, end)
		if i < 0 {
			return usage{}, false, false
		}
		end = i
		if b[j] != '{' {
			continue
		}
		if e := jsonscan.ValueEnd(b, j); e > 0 {
			// OpenAI's prompt_tokens and completion_tokens, or the
			// Responses and Messages APIs' input_tokens and output_tokens.
			if u, ok := chunk.ReadUsage(b[j:e]); ok {
				return usage{tokens{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens}, u.CachedTokens, u.HasCached}, u.HasPrompt, true
			}
		}
	}
	return usage{}, false, false
}

// usage is what findUsage reads: the tokens, and the prompt tokens the
// engine's prefix cache served when it says (HasCached).
type usage struct {
	tokens
	CachedTokens int
	HasCached    bool
}
