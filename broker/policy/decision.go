package policy

import (
	"slices"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// Request is one request as the broker sees it: the gateway's headers,
// parsed. Nothing in it is modified by the Router.
type Request struct {
	Tenant, Model, Endpoint, Conversation, Priority string // Model: alias, model id, or "model:adapter"
	PromptTokens, MaxTokens                         int
	Prefix                                          []uint64 // chained block hashes (Llm-Prefix)
	Features                                        []string // Llm-Features, e.g. "code"
	Deadline                                        time.Time
	// TTFTObjective is the request's time-to-first-token objective
	// (Llm-TTFT-Objective); 0 takes the tenant's, then the model's.
	TTFTObjective time.Duration
	Exclude       []string
	// Avoid names replicas that were slow to accept this request: they
	// stay candidates, chosen only when no other candidate is left.
	Avoid []string
	// ColdWaited marks a request the gateway held while its cold model
	// loaded: its request quota was charged when it was held.
	ColdWaited bool
	// Pin is the replica holding the stored response this request
	// continues (previous_response_id): the only candidate, whatever the
	// pool rules say, and no other replica when it cannot serve.
	Pin string
	// ID is the request id (Llm-Request-Id): a tpm reservation is held
	// under it until the adapter's usage event settles it.
	ID string
	// ResumeFrom names the replica a continuation resumes from (Llm-Resume):
	// the request was admitted once, so neither quota nor capacity refuse
	// it again, and its quota is not charged twice.
	ResumeFrom   string
	ResumeTokens int
	// Prompt returns the canonical prompt. It is called at most once per
	// decision, and only when a regex cascade rule has to be evaluated; nil
	// means no prompt (regex rules never match).
	Prompt func() []byte
}

// Reason codes of a decision (X-Switchyard-Reason). A decision's Reason is
// the step that picked the replica, preceded by what changed the route on
// the way, joined with "+": "fallback:chat-small+pool-fallback-general+power-of-two".
const (
	ReasonResponse     = "response-affinity" // the replica holding the previous response
	ReasonSession      = "session-affinity"  // rendezvous hash of the conversation
	ReasonLora         = "lora-affinity"     // replica already running the adapter, or with a free slot
	ReasonPrefix       = "prefix-affinity"   // longest warm prefix chain
	ReasonPredicted    = "predicted-ttft"    // lowest predicted TTFT among the prefix holders and a sample
	ReasonPowerOfTwo   = "power-of-two"      // lower load_score of two random candidates
	ReasonOnly         = "only-candidate"    // one candidate: nothing to choose
	ReasonStaleRandom  = "stale-random"      // every candidate's load data older than stale_after
	ReasonPoolFallback = "pool-fallback-general"
	// ReasonPanic: fewer than the pool's panic_below of its ready replicas
	// looked alive, so the choice was over all of them (panicked).
	ReasonPanic      = "panic"
	ReasonCanaryGone = "canary-unavailable" // canary drawn, no canary replica: stable version instead
	ReasonFallback   = "fallback:"          // followed by the alias fallen back to
	ReasonDeadline   = "deadline"           // chosen replica could not meet the deadline; the fastest one could
	ReasonBatchRoom  = "batch-room"         // batch work: the chosen replica had no room for it; another had
	ReasonSplit      = "split"              // a disaggregated model's check: prefill leg elsewhere, or why not (never switches)
	ReasonObjective  = "ttft-objective"     // chosen replica's predicted TTFT missed the objective; the fastest one's met it (or batch work)
	// ReasonSpill is followed by the router's region and the replica's:
	// "spill:eu->us+power-of-two" (the candidates were another region's).
	ReasonSpill     = "spill:"
	ReasonFairShare = "fair-share" // chosen replica predicted above the pool's shed_after, another below; or the pool sheds, tenants above their fair share refused
)

// Where prefix affinity's knowledge came from (Decision.PrefixSource).
const (
	PrefixKVEvents   = "kv-events"  // the engines' KV-cache events, exact (a decider alone with predicted-ttft adds what it sent that the engine has not reported yet)
	PrefixPlacements = "placements" // where brokers sent earlier requests
)

// Why a candidate lost (Alternative.Why).
const (
	WhyHigherLoad     = "higher load_score"
	WhyHigherScore    = "higher score" // the profile weighs more than load_score
	WhySaturated      = "saturated"
	WhyReleased       = "above release threshold"
	WhyNotDrawnHolder = "not drawn among the prefix's holders"
	WhyOutweighed     = "a lighter replica outweighs its prefix" // prefix affinity let it go for the power-of-two pair's lighter replica
	WhyNotAffine      = "not session-affine"
	WhyNoAdapter      = "adapter not loaded"
	WhyNoAdapterSlot  = "no free adapter slot"
	WhyShorterPrefix  = "shorter prefix match"
	WhyNotSampled     = "not sampled by power-of-two"
	WhyNotDrawn       = "not drawn (stale load data)"
	WhyDeadline       = "estimated wait beyond the deadline"
	WhyNoBatchRoom    = "no room for batch work"
	WhyObjective      = "predicted TTFT beyond the objective"
	WhyHigherTTFT     = "higher predicted TTFT"
	WhyShedAfter      = "predicted TTFT above the pool's shed_after"
	WhyNotWeighed     = "neither a prefix holder nor sampled"
	WhyMoreWork       = "more prefill work ahead" // than the replica chosen (predicted-ttft alone), or than the pair's lighter one (prefix affinity let it go)
)

// Decision is one explained routing decision. The caller owns it and passes
// it back in; Decide and Explain overwrite every field.
type Decision struct {
	Requested, Model, Version, Lora, Pool, Replica, Reason string

	// Region is the router's region (Config.Region), ReplicaRegion the
	// chosen replica's (its heartbeat's); Spilled says the choice left the
	// router's region (README, "Regions"), SpillPenalty what it added to
	// the predicted TTFT of that region's candidates and
	// SpillPenaltySource where that came from (PenaltyTable,
	// PenaltyMeasured, PenaltyDefault).
	Region, ReplicaRegion string
	Spilled               bool
	SpillPenalty          time.Duration
	SpillPenaltySource    string

	Score float64 // the chosen replica's score (the default profile's: its load_score, saturation penalty included)
	// PredictedTTFT is the chosen replica's predicted time to first token
	// for the request, in ms; 0 with NoTTFTEvidence: its engine has given
	// no evidence of its TTFT yet, so nothing of its own is predicted (an
	// objective judges it by the group's lowest base TTFT, objective.go).
	PredictedTTFT  float64
	NoTTFTEvidence bool
	Alts           [3]subjects.Alternative
	NAlts          int // top alternatives, lowest score first, why each lost

	// Profile is the profile that chose the replica, Scorers its scorers
	// and Weights their weights (the profile's, read only); Values are the
	// scorers' values for the chosen replica, AltValues for each of Alts.
	// Score is the sum of weight × value.
	Profile   string
	Scorers   []string
	Weights   []float64
	Values    [table.MaxScorers]float64
	AltValues [3][table.MaxScorers]float64

	// Ejected names replicas of the pool out of rotation for their engine
	// failures (the first NEjected); EjectPanic says they were kept in,
	// because more than MaxEjectedShare of the pool was ejected.
	Ejected    [4]string
	NEjected   int
	EjectPanic bool
	// Panic: fewer than the pool's panic_below of its ready replicas
	// looked alive, and the choice was over all of them.
	Panic bool

	PrefixBlocks, PrefixMatched int
	// Prefill is the replica that runs the prefill leg of a split request
	// ("" when served whole); Split says why it was split or served whole
	// ("" for a model without disaggregation), and UncachedTokens is the
	// prompt less what the decode replica was known to hold.
	Prefill, Split string
	UncachedTokens int
	// PrefixSource says where a prefix match came from: PrefixKVEvents
	// (the exact index) or PrefixPlacements; "" without one. KVFeedRefused,
	// for a request with a prefix not matched from the exact index, is why
	// the chosen replica's KV-event feed is failing (its heartbeat's
	// kv_events_refused): the reason its knowledge came from placements.
	PrefixSource  string
	KVFeedRefused string
	// TTFTObjective is the objective the decision held the replicas to
	// (the request's, the tenant's or the model's; 0: none).
	TTFTObjective time.Duration
	// Shares, when the pool shed (every candidate saturated, or predicted
	// above its shed_after), are the request's tenant's part of the pool's
	// in-flight tokens, then the largest other tenants': the first NShares.
	Shares        [4]subjects.TenantShare
	NShares       int
	TableRevision uint64
	// LoadViewAge is the age of the chosen replica's load view: the time
	// since its heartbeat, or the load delta on top of it, was measured.
	LoadViewAge time.Duration
	// Duration is the time the decision took, measured only when
	// Config.Clock is set; otherwise the caller fills it in.
	Duration time.Duration

	Err *subjects.APIError // non-nil: rejected (status, code, message, RetryAfter, Headers)

	// ControlLoad: a cold-tier model was asked for and has no ready replica;
	// the broker publishes llm.control.load for LoadModel/LoadVersion. The
	// request itself may still be routed to a fallback (then Err is nil and
	// Model is the fallback's model).
	ControlLoad            bool
	LoadModel, LoadVersion string
	// Placement: the broker should publish Prefix → Replica on
	// llm.placement.<Model>, because this decision placed blocks where the
	// prefix map did not already have them.
	Placement bool
	// SentPrefill is the request's uncached prompt tokens on the chosen
	// replica, which the commit added to its queued prefill: the
	// placement tells the other deciders.
	SentPrefill int
	// ReservedTokens is what the tenant's tpm bucket was charged (prompt +
	// max_tokens, or the model's default_max_tokens); usage events settle it.
	ReservedTokens int
}

// Alternatives returns the recorded alternatives.
func (d *Decision) Alternatives() []subjects.Alternative { return d.Alts[:d.NAlts] }

// scores pairs the profile's scorers with values.
func (d *Decision) scores(values []float64) []subjects.Score {
	out := make([]subjects.Score, len(d.Scorers))
	for k, n := range d.Scorers {
		out[k] = subjects.Score{Scorer: n, Weight: d.Weights[k], Value: values[k]}
	}
	return out
}

// Wire renders the decision for llm.decision.<pool> and llm.explain replies.
// The caller adds request id, trace id and the decision time.
func (d *Decision) Wire(req *Request) subjects.Decision {
	w := subjects.Decision{
		Tenant:              req.Tenant,
		Requested:           d.Requested,
		Model:               d.Model,
		Version:             d.Version,
		Lora:                d.Lora,
		Pool:                d.Pool,
		Replica:             d.Replica,
		Reason:              d.Reason,
		Score:               d.Score,
		Region:              d.Region,
		ReplicaRegion:       d.ReplicaRegion,
		Spilled:             d.Spilled,
		SpillPenaltyMillis:  ms(d.SpillPenalty),
		SpillPenaltySource:  d.SpillPenaltySource,
		PredictedTTFTMillis: d.PredictedTTFT,
		Alternatives:        slices.Clone(d.Alternatives()),
		PromptTokens:        req.PromptTokens,
		PrefixBlocks:        d.PrefixBlocks,
		PrefixMatched:       d.PrefixMatched,
		PrefixSource:        d.PrefixSource,
		KVFeedRefused:       d.KVFeedRefused,
		NoTTFTEvidence:      d.NoTTFTEvidence,
		Status:              200,
		TableRevision:       d.TableRevision,
		DurationNanos:       int64(d.Duration),
		EjectPanic:          d.EjectPanic,
		ResumeFrom:          req.ResumeFrom,
		ResumeTokens:        req.ResumeTokens,

		PrefillReplica:      d.Prefill,
		Split:               d.Split,
		UncachedTokens:      d.UncachedTokens,
		TTFTObjectiveMillis: d.TTFTObjective.Milliseconds(),
	}
	if d.Profile != "" {
		w.Profile = d.Profile
		w.Scores = d.scores(d.Values[:])
		for k := range w.Alternatives {
			w.Alternatives[k].Scores = d.scores(d.AltValues[k][:])
		}
	}
	if d.NEjected > 0 {
		w.Ejected = slices.Clone(d.Ejected[:d.NEjected])
	}
	if d.NShares > 0 {
		w.Shares = slices.Clone(d.Shares[:d.NShares])
	}
	if d.Err != nil {
		w.Status, w.Code, w.Message = d.Err.Status, d.Err.Code, d.Err.Message
	}
	return w
}
