package subjects

import "time"

// Replica states, from the KV value and the heartbeat. The effective state is
// the more restrictive of the two (see Restrictive).
const (
	StateLoading  = "loading"
	StateReady    = "ready"
	StateDraining = "draining"
	StateDisabled = "disabled"
)

// stateRank orders states from least to most restrictive.
func stateRank(s string) int {
	switch s {
	case StateReady:
		return 0
	case StateLoading:
		return 1
	case StateDraining:
		return 2
	case StateDisabled:
		return 3
	}
	return 4 // unknown states are treated as most restrictive
}

// Restrictive returns the more restrictive of two states.
func Restrictive(a, b string) string {
	if a == "" {
		return b
	}
	if b == "" {
		return a
	}
	if stateRank(a) >= stateRank(b) {
		return a
	}
	return b
}

// ValidState reports whether s is one of the four replica states.
func ValidState(s string) bool { return stateRank(s) < 4 }

// Heartbeat is published by every adapter on llm.heartbeat.<replica> each
// second. Its age is measured on the receiver's clock.
type Heartbeat struct {
	Replica string `json:"replica"`
	Model   string `json:"model"`
	Version string `json:"version"`
	Pool    string `json:"pool"`
	// Region is the adapter's --region ([A-Za-z0-9_-]{1,64}); empty is the
	// one default region of a deployment without regions, what a heartbeat
	// without the field says.
	Region   string  `json:"region,omitempty"`
	State    string  `json:"state"`
	KVUsage  float64 `json:"kv_usage"`
	Running  int     `json:"running"`
	Waiting  int     `json:"waiting"`
	MaxBatch int     `json:"max_batch"`
	MaxQueue int     `json:"max_queue"`
	// MaxBatchFrom and MaxQueueFrom say where each limit came from:
	// "config" (the operator), "engine" (read from it) or "default" (a
	// guess).
	MaxBatchFrom string    `json:"max_batch_from,omitempty"`
	MaxQueueFrom string    `json:"max_queue_from,omitempty"`
	Inflight     int       `json:"inflight"`
	Lora         LoraState `json:"lora"`
	// Endpoints are the inference endpoints the engine serves (none: the
	// base set, BaseEndpoints).
	Endpoints       []string `json:"endpoints,omitempty"`
	TTFTEWMAMillis  float64  `json:"ttft_ewma_ms"`
	QueueWaitMillis float64  `json:"queue_wait_ewma_ms"`
	// PrefillTokensPerSec is the replica's prefill rate in uncached
	// prompt tokens per second, learned from the first tokens it observed
	// (0: unknown); QueuedPrefillTokens is the uncached share of the prompt
	// tokens of the requests it holds that have no first token yet (by the
	// engine's recent prefix-cache hit ratio), batch lines left out where
	// the engine schedules by priority: they wait behind every interactive
	// request. Brokers predict a request's
	// time to first token from them (broker/policy, "Predicted TTFT").
	PrefillTokensPerSec float64 `json:"prefill_tps,omitempty"`
	QueuedPrefillTokens int     `json:"queued_prefill_tokens,omitempty"`
	// DecodeMillis is how long a request holds its batch slot after its
	// first token (first token to the stream's end), a moving average over
	// the streams that ended (0: unknown). With a full batch a new request
	// waits for a running one to end: a slot frees about every
	// DecodeMillis/max_batch, and brokers count that wait in the predicted
	// time to first token.
	DecodeMillis float64 `json:"decode_ms,omitempty"`
	// BatchWaiting is, at an engine scheduling by priority, how many of
	// the requests waiting for a batch slot are batch lines: the adapter's
	// batch lines beyond the batch, as it counts its own. An interactive
	// request is admitted ahead of them, so brokers leave them out of its
	// wait for a slot.
	BatchWaiting int  `json:"batch_waiting,omitempty"`
	ScrapeOK     bool `json:"scrape_ok"`
	// EngineFailures counts the engine's failed answers (5xx, 429, 401/403,
	// a 404 for the model or endpoint the replica registered, connection
	// failures) since its last success; EngineSuccesses counts
	// its successes, so a broker can tell a new streak from an old one.
	// Brokers eject a replica on the streak (see EjectAfterFailures).
	EngineFailures  int    `json:"engine_failures"`
	EngineSuccesses uint64 `json:"engine_successes"`
	// AuthFailed: the engine refused the adapter's API key (401/403).
	AuthFailed bool `json:"auth_failed,omitempty"`
	// KVBlocks and BlockSize are the engine's KV capacity in blocks and
	// tokens per block (0: unknown). KVEvents says the adapter's KV-event
	// feed is live: its key updates on llm.kv.<replica> are exact; false
	// after it lost events it could not replay, until it has resynced.
	KVBlocks  int  `json:"kv_blocks,omitempty"`
	BlockSize int  `json:"block_size,omitempty"`
	KVEvents  bool `json:"kv_events,omitempty"`
	// KVEventsRefused says the feed is failing: the last message the
	// engine sent on it was refused, for this reason (one of
	// kvevents.Refusals); empty once a batch is read again. Prefix
	// affinity then works from placements.
	KVEventsRefused string `json:"kv_events_refused,omitempty"`
	// Scheduling is SchedulingPriority when the engine serves its queue by
	// each request's priority (vLLM's --scheduling-policy priority) and
	// the adapter sends it the router's: batch work may then fill the
	// replica's batch (broker/policy, batch-room). Empty: first come first
	// served.
	Scheduling     string `json:"scheduling,omitempty"`
	Seq            uint64 `json:"seq"`
	SentUnixMillis int64  `json:"sent_unix_ms"`
}

// SchedulingPriority is Heartbeat.Scheduling of a replica whose engine
// schedules by priority.
const SchedulingPriority = "priority"

// BatchHold is how many requests, running and waiting, a replica whose
// engine schedules by priority may hold and still take batch work: its
// whole batch and, behind it, a queue of a quarter of a batch (at most a
// quarter of its queue, none when the queue is unknown). Batch lines
// waiting there are served after every interactive request, so they delay
// none; they refill each slot that frees when no interactive request
// waits, which the batch cannot do from outside the engine: an answer,
// the batcher's next line and its routing take longer than the step that
// freed the slot. Brokers (broker/policy, batch-room) and the adapter of
// such an engine both apply it, the adapter with its exact count.
func BatchHold(maxBatch, maxQueue int) int {
	return maxBatch + max(0, min(maxBatch/4, maxQueue/4))
}

// LoadDelta is published by an adapter on llm.load.<replica> when a
// request starts, gets its first token or ends, at most one every
// LoadDeltaEvery: the replica's load as the adapter counts it now, on top
// of the heartbeat it follows. Deciders see load within tens of
// milliseconds of a change instead of up to a second. A delta speaks only
// for the heartbeat whose Seq it names: a decider applies it on top of
// that heartbeat and drops it when it holds another, so a delta never
// outlives the next heartbeat's truth. Deciders believe it only for the
// replica the subject names.
type LoadDelta struct {
	Replica string `json:"replica"`
	// Heartbeat is the Seq of the adapter's last heartbeat; Seq numbers
	// the deltas of one adapter run, from 1.
	Heartbeat uint64 `json:"hb_seq"`
	Seq       uint64 `json:"seq"`
	// Inflight is the requests the adapter holds now (the heartbeat's
	// inflight, later); QueuedPrefillTokens the prompt tokens of those
	// without a first token yet, as the heartbeat counts them.
	Inflight            int `json:"inflight"`
	QueuedPrefillTokens int `json:"queued_prefill_tokens"`
	// TTFT holds the first tokens seen since the last delta of requests
	// whose decider predicted their time to first token (Llm-Predicted-TTFT),
	// at most MaxLoadDeltaTTFT: each decider compares its own predictions
	// with what the replica observed.
	TTFT           []TTFTSample `json:"ttft,omitempty"`
	SentUnixMillis int64        `json:"sent_unix_ms"`
}

// TTFTSample is one request's predicted and observed time to first token,
// in ms, and the decider that predicted it.
type TTFTSample struct {
	Broker    string  `json:"broker"`
	Predicted float64 `json:"predicted_ms"`
	Observed  float64 `json:"observed_ms"`
}

// Load deltas: at most one every LoadDeltaEvery per replica, of at most
// MaxLoadDeltaBytes, with at most MaxLoadDeltaTTFT samples.
const (
	LoadDeltaEvery    = 50 * time.Millisecond
	MaxLoadDeltaBytes = 4 << 10
	MaxLoadDeltaTTFT  = 16
)

// EjectAfterFailures is the streak of engine failures after which brokers
// eject a replica (Envoy's consecutive_5xx default); an adapter sends a
// heartbeat at once when its streak reaches it.
const EjectAfterFailures = 5

// Ejection is published by a broker on llm.eject.<replica> when it ejects a
// replica for its engine failures, for the dashboard and operators.
type Ejection struct {
	Replica     string `json:"replica"`
	Broker      string `json:"broker"`
	Failures    int    `json:"failures"`
	Count       int    `json:"ejections"` // consecutive ejections: the back-off multiplier
	UntilUnixMs int64  `json:"until_unix_ms"`
}

// LoraState is the adapters a replica is running and waiting on.
type LoraState struct {
	Running []string `json:"running"`
	Waiting []string `json:"waiting"`
	Max     int      `json:"max"`
}

// Presence is a decider's announcement on llm.broker.presence, every
// second: deciders count each other with it to divide tenant quotas. A
// broker says Kind "broker"; a gateway that decides its HTTP requests
// "gateway". Tenants are the quota keys of the tenants whose requests the
// decider admitted within the last minute. An announcement that is not a
// JSON object is a bare decider id: a broker that shares every tenant's
// quota.
type Presence struct {
	ID      string   `json:"id"`
	Kind    string   `json:"kind"`
	Tenants []string `json:"tenants,omitempty"`
}

// Presence kinds.
const (
	PresenceBroker  = "broker"
	PresenceGateway = "gateway"
)

// Placement tells every broker that a request was sent to Replica, with
// its uncached prompt tokens there, and where its prefix blocks went: to
// Replica, and for a split request first to Prefill, the prefill replica
// that computed them (the decode replica holds them once pulled); none
// when the prefix map had them already. Other deciders count the request
// as in flight on the replica until its next load delta or heartbeat.
type Placement struct {
	Model    string   `json:"m"`
	Replica  string   `json:"r"`
	Prefill  string   `json:"p,omitempty"`
	Blocks   []uint64 `json:"b"`
	Uncached int      `json:"u,omitempty"`
}

// KVUpdate is published by an adapter on llm.kv.<replica>: which request
// keys (the Llm-Prefix block hashes brokers match on) its engine now holds
// and which it evicted, learned from the engine's KV-cache events. Deciders
// believe it only for the replica the subject names, and keep at most
// KVBlocks keys of it.
type KVUpdate struct {
	Replica string `json:"replica"`
	Model   string `json:"model"`
	// Seq numbers the updates of one adapter run, from 1; a decider that
	// sees one missing drops the replica's keys until the next Reset.
	Seq uint64 `json:"seq"`
	// Reset voids every key known of the replica before this update's
	// Stored: the adapter (re)started, lost events it could not replay, the
	// engine restarted or cleared its cache, or a decider asked (KVSync).
	Reset bool `json:"reset,omitempty"`
	// Resend marks a Reset sent only because a decider asked: nothing was
	// lost, and Evicted names what left since the last update. A decider
	// that saw every update before it keeps what it holds and applies this
	// one as any other; only the others start over.
	Resend bool `json:"resend,omitempty"`
	// KVBlocks is the engine's KV capacity in blocks, the bound of the
	// replica's keys in every decider.
	KVBlocks int      `json:"kv_blocks"`
	Stored   []uint64 `json:"stored,omitempty"`
	Evicted  []uint64 `json:"evicted,omitempty"`
}

// Bounds of a KVUpdate: an adapter splits a larger change into several.
const (
	MaxKVUpdateKeys  = 4096
	MaxKVUpdateBytes = 128 << 10
	MaxKVBlocks      = 1 << 24
)

// Usage is published by an adapter when a request finishes, so brokers can
// settle the token reservation made at admission.
type Usage struct {
	Tenant           string `json:"tenant"`
	Model            string `json:"model"`
	Replica          string `json:"replica"`
	RequestID        string `json:"request_id"`
	PromptTokens     int    `json:"prompt_tokens"`
	CompletionTokens int    `json:"completion_tokens"`
	ReservedTokens   int    `json:"reserved_tokens"`
	// Broker is the broker that admitted the request and holds its reservation.
	Broker string `json:"broker,omitempty"`
	// Resumed marks a continuation's usage. The broker reserved only the
	// completion it may generate, under the continuation's own request id,
	// so only its completion tokens settle that: the prompt and the carried
	// text were charged with the first part.
	Resumed bool `json:"resumed,omitempty"`
	// CachedTokens is how many prompt tokens the engine's prefix cache
	// served, when its usage said; EnginePromptTokens is the prompt as the
	// engine counted it (a continuation's included, which PromptTokens
	// leaves out for the token quota). Budgets settle on both.
	CachedTokens       int `json:"cached_tokens,omitempty"`
	EnginePromptTokens int `json:"engine_prompt_tokens,omitempty"`
}

// ControlLoad asks for a cold-tier model to be loaded.
type ControlLoad struct {
	Model     string `json:"model"`
	Version   string `json:"version,omitempty"`
	Tenant    string `json:"tenant"`
	Requested int64  `json:"requested_unix_ms"`
}

// Load phases of LoadStatus, in order; a load ends ready or failed. An
// unload goes unloading (its replicas drain), then unloaded or failed.
const (
	LoadRequested = "requested"
	LoadStarted   = "started"
	LoadReady     = "ready"
	LoadFailed    = "failed"
	LoadUnloading = "unloading"
	LoadUnloaded  = "unloaded"
)

// LoadStatus is one step of a load or unload, on llm.control.load.status.
type LoadStatus struct {
	Model   string `json:"model"`
	Version string `json:"version,omitempty"`
	Phase   string `json:"phase"`
	Loader  string `json:"loader"`
	// Error says why a load or unload failed.
	Error string `json:"error,omitempty"`
	// StartedUnixMillis is when the load was requested; ElapsedMillis the
	// time since (at ready, the measured time to ready).
	StartedUnixMillis int64 `json:"started_unix_ms"`
	ElapsedMillis     int64 `json:"elapsed_ms"`
	// ExpectedMillis is how long the load is expected to take in all: the
	// model's expected_load_seconds, else the last measured time to ready
	// (0: unknown).
	ExpectedMillis int64 `json:"expected_ms,omitempty"`
	// RetryAfterMillis, on a failed load, is the cooldown before the next
	// request may start another.
	RetryAfterMillis int64 `json:"retry_after_ms,omitempty"`
	SentUnixMillis   int64 `json:"sent_unix_ms"`
}

// Alternative is a replica that lost, with its score and why.
type Alternative struct {
	Replica string  `json:"replica"`
	Score   float64 `json:"score"`
	Why     string  `json:"why"`
	// PredictedTTFTMillis is the candidate's predicted time to first
	// token for this request; 0 with NoTTFTEvidence, when its engine has
	// given no evidence of its TTFT yet.
	PredictedTTFTMillis float64 `json:"predicted_ttft_ms"`
	NoTTFTEvidence      bool    `json:"no_ttft_evidence,omitempty"`
	// Scores are the profile's scorers' values for the candidate.
	Scores []Score `json:"scores,omitempty"`
}

// Score is one scorer's value for a candidate, and the weight the
// profile gives it: a candidate's score is the sum of weight × value.
type Score struct {
	Scorer string  `json:"scorer"`
	Weight float64 `json:"weight"`
	Value  float64 `json:"value"`
}

// Decision is one explained routing decision.
type Decision struct {
	RequestID string  `json:"request_id,omitempty"`
	TraceID   string  `json:"trace_id,omitempty"`
	Tenant    string  `json:"tenant"`
	Requested string  `json:"requested_model"`
	Model     string  `json:"model,omitempty"`
	Version   string  `json:"version,omitempty"`
	Lora      string  `json:"lora,omitempty"`
	Pool      string  `json:"pool,omitempty"`
	Replica   string  `json:"replica,omitempty"`
	Reason    string  `json:"reason"`
	Score     float64 `json:"score"`
	// Region is the deciding broker's or gateway's region, ReplicaRegion
	// the chosen replica's (both empty without regions); Spilled says the
	// request was sent out of the decider's region (reason spill), and
	// SpillPenaltyMillis what the spill added to that region's predicted
	// TTFTs, SpillPenaltySource where that came from: "table"
	// (policy.regions.<from>.penalty), "measured" (the round trip the
	// decider measured to the region) or "default".
	Region             string  `json:"region,omitempty"`
	ReplicaRegion      string  `json:"replica_region,omitempty"`
	Spilled            bool    `json:"spilled,omitempty"`
	SpillPenaltyMillis float64 `json:"spill_penalty_ms,omitempty"`
	SpillPenaltySource string  `json:"spill_penalty_source,omitempty"`
	// PredictedTTFTMillis is the chosen replica's predicted time to
	// first token.
	PredictedTTFTMillis float64       `json:"predicted_ttft_ms,omitempty"`
	Alternatives        []Alternative `json:"alternatives,omitempty"`
	// Ejected lists replicas of the pool left out for their engine
	// failures; EjectPanic says they were kept in because too many of the
	// pool were (see the policy's MaxEjectedShare).
	Ejected       []string `json:"ejected,omitempty"`
	EjectPanic    bool     `json:"eject_panic,omitempty"`
	PromptTokens  int      `json:"prompt_tokens"`
	PrefixBlocks  int      `json:"prefix_blocks"`
	PrefixMatched int      `json:"prefix_matched"`
	// PrefixSource says where the prefix match came from: "kv-events"
	// (the engines' own caches) or "placements" (where brokers sent earlier
	// requests); empty without a match.
	PrefixSource string `json:"prefix_source,omitempty"`
	// KVFeedRefused is set when the request's prefix was not matched from
	// the engines' own caches because the chosen replica's KV-event feed
	// is failing: why its adapter refused the engine's last message
	// (Heartbeat.KVEventsRefused).
	KVFeedRefused string `json:"kv_feed_refused,omitempty"`
	// NoTTFTEvidence: the chosen replica's engine has given no evidence of
	// its time to first token yet, so none of its own is predicted
	// (PredictedTTFTMillis is 0); a TTFT objective judged it as the lowest
	// base TTFT of the candidates with evidence on top of its queue, or not
	// at all when none had any.
	NoTTFTEvidence bool   `json:"no_ttft_evidence,omitempty"`
	Status         int    `json:"status"`
	Code           string `json:"code,omitempty"`
	Message        string `json:"message,omitempty"`
	TableRevision  uint64 `json:"table_revision"`
	DurationNanos  int64  `json:"duration_ns"`
	// ResumeFrom is set on a continuation: the replica whose answer it
	// continues, and the completion tokens it carried over.
	ResumeFrom     string `json:"resume_from,omitempty"`
	ResumeTokens   int    `json:"resume_tokens,omitempty"`
	DecidedUnixMil int64  `json:"decided_unix_ms"`
	// For a model with disaggregation: the replica running the prefill
	// leg (none when served whole), why the request was split or served
	// whole, and its prompt tokens the decode replica was not known to hold.
	PrefillReplica string `json:"prefill_replica,omitempty"`
	Split          string `json:"split,omitempty"`
	UncachedTokens int    `json:"uncached_tokens,omitempty"`
	// TTFTObjectiveMillis is the time-to-first-token objective the
	// replicas were held to (0: none).
	TTFTObjectiveMillis int64 `json:"ttft_objective_ms,omitempty"`
	// Shares are set when the pool shed: the request's tenant's part of
	// the pool's tokens in flight first, then the largest others'.
	Shares []TenantShare `json:"shares,omitempty"`
	// Profile is the replica choice's profile; Scores its scorers' values
	// for the chosen replica.
	Profile string  `json:"profile,omitempty"`
	Scores  []Score `json:"scores,omitempty"`
}

// TenantShare is one tenant's part of a shedding pool's tokens in flight,
// as the deciding broker or gateway counts them.
type TenantShare struct {
	Tenant string `json:"tenant"`
	Tokens int64  `json:"tokens"`
	// Share is Tokens over the pool's tokens in flight; FairShare is
	// Weight over the weights of the tenants in flight.
	Share     float64 `json:"share"`
	Weight    float64 `json:"weight"`
	FairShare float64 `json:"fair_share"`
}

// LedgerRecord is one settled request on the LEDGER stream
// (llm.ledger.<tenant>), written by the adapter that served it, once per
// client request: its Nats-Msg-Id is the tenant and the request's id, so
// a retry on another replica adds no second record within the stream's
// duplicate window. A request resumed on another replica is one record
// too, Resumed, written by the continuation's adapter with the parts
// before it added (docs/protocol.md, "Budgets and the ledger").
type LedgerRecord struct {
	RequestID string `json:"request_id"`
	Tenant    string `json:"tenant"`
	// Key is the id of the API key (never the key), "" without one.
	Key          string `json:"key,omitempty"`
	Model        string `json:"model"`
	Version      string `json:"version,omitempty"`
	Pool         string `json:"pool,omitempty"`
	Replica      string `json:"replica"`
	PromptTokens int    `json:"prompt_tokens"`
	CachedTokens int    `json:"cached_tokens"`
	OutputTokens int    `json:"output_tokens"`
	// Cost is in the table's currency; CostMicro the same in micro-units,
	// which sums exactly.
	Cost      float64 `json:"cost"`
	CostMicro int64   `json:"cost_micro"`
	Priority  string  `json:"priority,omitempty"`
	// Decider is the broker or gateway that admitted the request.
	Decider string `json:"decider,omitempty"`
	Time    int64  `json:"time_unix_ms"`
	// Holder is the decider's lease the request was reserved from, and
	// Budgets the keys of the budgets it was charged to in the budgets
	// bucket (the tenant's, the key's): what corrects the spend of a
	// decider that died with reservations open.
	Holder  string    `json:"holder,omitempty"`
	Budgets [2]string `json:"budgets,omitzero"`
	// Resumed marks the record of a request whose replica failed
	// mid-answer and whose answer continued on another: its counts are of
	// every part.
	Resumed bool `json:"resumed,omitempty"`
}
