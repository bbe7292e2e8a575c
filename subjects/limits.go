package subjects

import (
	"strconv"
	"time"
)

// Bounds on what a sender controls (docs/security.md, "Bounds"). A message
// over one is refused with a 400 before any work in proportion to it.
const (
	// MaxModelChars bounds a model name (Llm-Model, a body's "model"): it
	// becomes a metric label and dashboard state.
	MaxModelChars = 128
	// MaxExclude bounds the replicas a retry may exclude (Llm-Exclude).
	MaxExclude = 16
	// MaxAvoid bounds the replicas a retry may deprioritize (Llm-Avoid).
	MaxAvoid = 16
	// MaxFeatures bounds the flags of Llm-Features.
	MaxFeatures = 16
	// MaxHeaderChars bounds any one routing header the broker reads:
	// Llm-Prefix at its most blocks (256 of up to 17 characters) is under it.
	MaxHeaderChars = 8192
	// MaxRequestIDChars bounds Llm-Request-Id, a reservation's key.
	MaxRequestIDChars = 128

	// Heartbeat ranges: counts beyond these are not a real engine's.
	MaxHeartbeatCount  = 1 << 20
	MaxHeartbeatMillis = 24 * 60 * 60 * 1000
	MaxLoraAdapters    = 1024
	// MaxPrefillTokensPerSec bounds a heartbeat's prefill rate, and
	// MaxQueuedPrefillTokens its queued prompt tokens.
	MaxPrefillTokensPerSec = 1e8
	MaxQueuedPrefillTokens = 1 << 30
)

// The range of a time-to-first-token objective (X-Switchyard-TTFT-Objective,
// Llm-TTFT-Objective, tenants.<t>.ttft_objective, models.<m>.ttft_objective).
const (
	MinTTFTObjective = time.Millisecond
	MaxTTFTObjective = 10 * time.Minute
)

// ParseTTFTObjective reads a TTFT objective: a Go duration ("800ms", "2s")
// from MinTTFTObjective to MaxTTFTObjective.
func ParseTTFTObjective(s string) (time.Duration, bool) {
	if len(s) > 32 {
		return 0, false
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < MinTTFTObjective || d > MaxTTFTObjective {
		return 0, false
	}
	return d, true
}

// MaxAcceptHeld bounds Llm-Held: no adapter holds an accept longer (its
// accept delay is at most a second).
const MaxAcceptHeld = time.Second

// MaxDeadlineMillis bounds Llm-Deadline: the last millisecond of the year
// 9999 UTC, past any real deadline and far from where int64 arithmetic on
// times overflows.
const MaxDeadlineMillis = 253402300799999

// ParseDeadline reads an Llm-Deadline value: unix milliseconds from 1 to
// MaxDeadlineMillis. An empty value is no deadline (the zero time); any
// other value out of that range is a 400 that names the header.
func ParseDeadline(v string) (time.Time, *APIError) {
	if v == "" {
		return time.Time{}, nil
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms < 1 || ms > MaxDeadlineMillis {
		return time.Time{}, NewError(400, CodeInvalidRequest, HdrDeadline+" must be unix milliseconds from 1 to "+strconv.Itoa(MaxDeadlineMillis))
	}
	return time.UnixMilli(ms), nil
}
