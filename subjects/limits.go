package subjects

// Bounds on what a sender controls (docs/security.md, "Bounds"). A message
// over one is refused with a 400 before any work in proportion to it.
const (
	// MaxModelChars bounds a model name (Llm-Model, a body's "model"): it
	// becomes a metric label and dashboard state.
	MaxModelChars = 128
	// MaxExclude bounds the replicas a retry may exclude (Llm-Exclude).
	MaxExclude = 16
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
)
