// Package table holds the routing table: one Go type per KV key of the
// llm-routing bucket, a strict JSON codec, per-key validation and the
// immutable Snapshot that brokers and gateways route from. It is pure: no
// NATS, no I/O.
package table

import (
	"encoding/json"
	"fmt"
	"regexp"
	"time"
)

// Key prefixes of the KV layout (docs/protocol.md, "Routing table").
const (
	KeyPolicy       = "policy"
	KeyBilling      = "billing"
	PrefixAliases   = "aliases."
	PrefixModels    = "models."
	PrefixPools     = "pools."
	PrefixTenants   = "tenants."
	PrefixKeys      = "keys."
	PrefixReplicas  = "replicas."
	DefaultTenant   = "default"
	PoolGeneral     = "general"
	PoolLongContext = "long-context"
	PoolPremium     = "premium"
	PoolBatch       = "batch"
	PoolCanary      = "canary"
	TierPremium     = "premium"
	TierStandard    = "standard"
	TierHot         = "hot"
	TierCold        = "cold"
)

// Pool rule conditions (policy.pool_rules[].when).
const (
	WhenLongContext = "long_context" // prompt tokens > long_context_tokens
	WhenPremium     = "premium"      // tenant tier premium
	WhenBatch       = "batch"        // priority batch
	WhenCanary      = "canary"       // canary version drawn
	WhenAlways      = "always"
)

// Duration is a time.Duration written as a Go duration string ("5s").
type Duration time.Duration

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration string such as \"5s\"")
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// LoadWeights weigh the signals of load_score.
type LoadWeights struct {
	KV    float64 `json:"kv"`
	Queue float64 `json:"queue"`
	Batch float64 `json:"batch"`
}

// PoolRule sends requests matching When to Pool. Rules are tried in order.
type PoolRule struct {
	When string `json:"when"`
	Pool string `json:"pool"`
}

// Policy is the value of the "policy" key.
type Policy struct {
	LongContextTokens        int         `json:"long_context_tokens"`
	AffinityReleaseThreshold float64     `json:"affinity_release_threshold"`
	SaturationKV             float64     `json:"saturation_kv"`
	LoadWeights              LoadWeights `json:"load_weights"`
	PrefixBlockChars         int         `json:"prefix_block_chars"`
	PrefixMaxBlocks          int         `json:"prefix_max_blocks"`
	StaleAfter               Duration    `json:"stale_after"`
	DeadAfter                Duration    `json:"dead_after"`
	PoolRules                []PoolRule  `json:"pool_rules"`
	AllowAnonymous           bool        `json:"allow_anonymous"`
	DecisionSample           float64     `json:"decision_sample"`
	// ReplicaChoice is how a replica is chosen among the candidates no
	// session or adapter affinity holds: ChoicePowerOfTwo (prefix affinity,
	// then the lower load_score of two) or ChoicePredictedTTFT (the lowest
	// predicted time to first token among the prefix holders and a small
	// sample). "" is ChoicePowerOfTwo.
	ReplicaChoice string `json:"replica_choice,omitempty"`
	// Profile names the replica choice's profile (Profiles; "" is
	// ProfileSwitchyard); a pool's profile overrides it.
	Profile string `json:"profile,omitempty"`
	// Scorers sets the weights of the profile's scorers (Scorers): a
	// scorer the profile has takes this weight instead of its own, one it
	// lacks joins it, 0 leaves it out. A pool's scorers go on top.
	Scorers map[string]float64 `json:"scorers,omitempty"`
	// Regions says, per deciding region, where its deciders spill when
	// every candidate of their own region is saturated or none is live
	// (broker/policy, "Regions"). A region without an entry does not
	// spill; only residency sends its requests elsewhere.
	Regions map[string]RegionPolicy `json:"regions,omitempty"`
}

// RegionPolicy is policy.regions.<from>: the regions a decider of <from>
// spills to, in order, and the penalty added to a remote candidate's
// predicted time to first token (0: the round trip the decider measured
// to the candidate's region, DefaultSpillPenalty until it has).
type RegionPolicy struct {
	Spill   []string `json:"spill"`
	Penalty Duration `json:"penalty,omitempty"`
}

// Spill bounds: a spill list longer than MaxSpillRegions, or a penalty
// beyond MaxSpillPenalty, is refused.
const (
	MaxSpillRegions = 16
	MaxSpillPenalty = 10 * time.Second
	// DefaultSpillPenalty is the penalty of a spill from a region that
	// sets none to a region whose round trip its decider has not measured
	// yet (decider, "Region round trips"): the round trip between two
	// regions of one continent, as a cloud provider's inter-region
	// latency tables give it.
	DefaultSpillPenalty = 50 * time.Millisecond
	// MaxRegions bounds the regions a table names (policy.regions and the
	// tenants' regions together, with the deciders' own).
	MaxRegions = 62
)

// Replica choices (policy.replica_choice).
const (
	ChoicePowerOfTwo    = "power-of-two"
	ChoicePredictedTTFT = "predicted-ttft"
)

// DefaultPolicy is the policy in force when the key is absent; decoding a
// policy value starts from it, so a value may name only what it changes.
func DefaultPolicy() Policy {
	return Policy{
		LongContextTokens:        16000,
		AffinityReleaseThreshold: 0.85,
		SaturationKV:             0.95,
		LoadWeights:              LoadWeights{KV: 0.6, Queue: 0.3, Batch: 0.1},
		PrefixBlockChars:         256,
		PrefixMaxBlocks:          64,
		StaleAfter:               Duration(5 * time.Second),
		DeadAfter:                Duration(15 * time.Second),
		PoolRules:                DefaultPoolRules(),
		DecisionSample:           1.0,
	}
}

// DefaultPoolRules is the seed's order: long-context, premium, batch, canary.
func DefaultPoolRules() []PoolRule {
	return []PoolRule{
		{When: WhenLongContext, Pool: PoolLongContext},
		{When: WhenPremium, Pool: PoolPremium},
		{When: WhenBatch, Pool: PoolBatch},
		{When: WhenCanary, Pool: PoolCanary},
	}
}

// Target is one weighted model version of an alias.
type Target struct {
	Model   string `json:"model"`
	Version string `json:"version,omitempty"`
	Weight  int    `json:"weight"`
}

// CascadeWhen is the condition of a cascade rule; every set field must hold.
type CascadeWhen struct {
	MaxPromptTokens *int     `json:"max_prompt_tokens,omitempty"`
	MinPromptTokens *int     `json:"min_prompt_tokens,omitempty"`
	Features        []string `json:"features,omitempty"`
	Regex           string   `json:"regex,omitempty"`
	Tier            string   `json:"tier,omitempty"`

	re *regexp.Regexp
}

// Re is the compiled Regex (nil when none).
func (w *CascadeWhen) Re() *regexp.Regexp { return w.re }

// CascadeRule routes to Alias when When holds.
type CascadeRule struct {
	When  CascadeWhen `json:"when"`
	Alias string      `json:"alias"`
}

// Alias is the value of aliases.<alias>.
type Alias struct {
	Targets   []Target      `json:"targets,omitempty"`
	Cascade   []CascadeRule `json:"cascade,omitempty"`
	Fallbacks []string      `json:"fallbacks,omitempty"`
}

// What a request for a cold model with no ready replica gets
// (models.<m>.on_cold).
const (
	OnColdReject = "reject" // 503 model_loading with a Retry-After (the default)
	OnColdWait   = "wait"   // held at the gateway until a replica is ready or the deadline
)

// Model is the value of models.<model>.
type Model struct {
	Versions         []string `json:"versions,omitempty"`
	Tier             string   `json:"tier,omitempty"`
	MaxContextTokens int      `json:"max_context_tokens,omitempty"`
	DefaultMaxTokens int      `json:"default_max_tokens,omitempty"`

	// Load and Unload are what `switchyard loader` runs to bring a cold
	// model up and to take it down again.
	Load   *Action `json:"load,omitempty"`
	Unload *Action `json:"unload,omitempty"`
	// IdleUnloadAfter unloads a cold model that has had no request for
	// this long (0: never).
	IdleUnloadAfter Duration `json:"idle_unload_after,omitempty"`
	// ExpectedLoadSeconds is how long a load is expected to take, until
	// one has been measured; it sets model_loading's Retry-After.
	ExpectedLoadSeconds float64 `json:"expected_load_seconds,omitempty"`
	// OnCold is OnColdReject (default) or OnColdWait.
	OnCold string `json:"on_cold,omitempty"`
	// Resume is how a generation whose replica fails mid-answer goes on
	// elsewhere: ResumeContinue (the default, "") re-issues it as a
	// continuation of the text so far; ResumeNone ends it with an error.
	Resume string `json:"resume,omitempty"`
	// Disaggregation splits a long prompt's prefill from its decode onto
	// replicas of role prefill and decode (nil: off).
	Disaggregation *Disaggregation `json:"disaggregation,omitempty"`
	// TTFTObjective is the time-to-first-token objective of the model's
	// requests that carry none and whose tenant sets none (0: none).
	TTFTObjective Duration `json:"ttft_objective,omitempty"`
	// Price is what the model's tokens cost (nil: nothing; its requests
	// are never refused for budget).
	Price *Price `json:"price,omitempty"`
}

// Price is models.<model>.price: amounts of the table's currency per
// million tokens, and the factor batch-priority work pays.
type Price struct {
	Input float64 `json:"input"`
	// CachedInput is the price of prompt tokens the engine's prefix cache
	// served (nil: Input).
	CachedInput *float64 `json:"cached_input,omitempty"`
	Output      float64  `json:"output"`
	// Batch multiplies the cost of batch-priority work (nil: 1).
	Batch *float64 `json:"batch,omitempty"`
}

// Bounds of the money the table holds (prices per million tokens, budget
// limits) and of the batch factor.
const (
	MaxPrice       = 1e6
	MaxBudgetLimit = 1e12
	MaxBatchFactor = 100
)

// Budget periods (tenants.<t>.budget.period and a key's): calendar
// periods in UTC, weeks from Monday, or the budget's whole life.
const (
	PeriodDay   = "day"
	PeriodWeek  = "week"
	PeriodMonth = "month"
	PeriodTotal = "total"
)

// ValidPeriod reports whether s names a budget period.
func ValidPeriod(s string) bool {
	return s == PeriodDay || s == PeriodWeek || s == PeriodMonth || s == PeriodTotal
}

// Budget is a spend budget: at most Limit (an amount of the table's
// currency) per Period. AlertOnly budgets warn (events, headers) and never
// refuse.
type Budget struct {
	Limit     float64 `json:"limit"`
	Period    string  `json:"period"`
	AlertOnly bool    `json:"alert_only,omitempty"`
}

// Billing is the value of the "billing" key.
type Billing struct {
	// Currency labels every amount of the table (default USD); it is a
	// label only, nothing is converted.
	Currency string `json:"currency,omitempty"`
}

// DefaultCurrency is the currency of a table without a billing key.
const DefaultCurrency = "USD"

// Disaggregation is models.<model>.disaggregation: when a request's
// uncached prompt tokens (its prompt less what the chosen decode replica
// already holds) reach MinUncachedTokens, its prefill runs on a prefill
// replica and its KV blocks move to the decode replica; below it the
// request is served whole, since a short or mostly cached prompt costs
// less than the transfer.
type Disaggregation struct {
	Enabled           bool `json:"enabled"`
	MinUncachedTokens int  `json:"min_uncached_tokens,omitempty"`
}

// MaxMinUncachedTokens bounds disaggregation.min_uncached_tokens: no
// context is longer.
const MaxMinUncachedTokens = 1 << 22

// Splits reports whether the model's requests may be split into a prefill
// and a decode leg.
func (m *Model) Splits() bool {
	return m != nil && m.Disaggregation != nil && m.Disaggregation.Enabled
}

// Replica roles (replicas.<replica>.role): a prefill replica computes
// prompts for decode replicas and is never given a whole request; a
// decode or both replica serves whole requests and decode legs.
const (
	RoleBoth    = "both"
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// ValidRole reports whether s is a replica role ("" is RoleBoth).
func ValidRole(s string) bool {
	return s == "" || s == RoleBoth || s == RolePrefill || s == RoleDecode
}

// Resume methods (models.<model>.resume).
const (
	ResumeContinue = "continue"
	ResumeNone     = "none"
)

// ResumeMethod is the model's resume method, ResumeContinue when unset.
func (m *Model) ResumeMethod() string {
	if m == nil || m.Resume == "" {
		return ResumeContinue
	}
	return m.Resume
}

// Action is one way of loading or unloading a model; exactly one field is
// set. Exec arguments and the webhook URL may hold {model} and {version}.
type Action struct {
	Exec       []string          `json:"exec,omitempty"`
	Webhook    string            `json:"webhook,omitempty"`
	Kubernetes *KubernetesAction `json:"kubernetes,omitempty"`
}

// KubernetesAction scales a Deployment through the API server's scale
// subresource.
type KubernetesAction struct {
	Namespace  string `json:"namespace"`
	Deployment string `json:"deployment"`
	// Replicas is the scale to set (load: default 1; unload: always 0).
	Replicas int `json:"replicas,omitempty"`
}

// Pool is the value of pools.<pool>: per-pool overrides.
type Pool struct {
	AffinityReleaseThreshold *float64 `json:"affinity_release_threshold,omitempty"`
	SaturationKV             *float64 `json:"saturation_kv,omitempty"`
	// ShedAfter, when set, makes the pool shed (refuse the requests of
	// tenants above their fair share) as soon as every candidate's
	// predicted time to first token is above it, not only once every
	// candidate is saturated (0: saturation only).
	ShedAfter Duration `json:"shed_after,omitempty"`
	// PanicBelow is the pool's panic threshold, as Envoy's: when fewer
	// than this share of its registered, ready replicas look alive
	// (heard within dead_after), the heartbeats are not believed and the
	// pool routes over all of those replicas (nil: DefaultPanicBelow; 0:
	// never).
	PanicBelow *float64 `json:"panic_below,omitempty"`
	// Profile and Scorers override the policy's for the pool's replicas.
	Profile string             `json:"profile,omitempty"`
	Scorers map[string]float64 `json:"scorers,omitempty"`
}

// Quota is a tenant's per-minute limits (0 = unlimited).
type Quota struct {
	RPM int `json:"rpm,omitempty"`
	TPM int `json:"tpm,omitempty"`
}

// Tenant is the value of tenants.<tenant>.
type Tenant struct {
	Tier          string            `json:"tier,omitempty"`
	AllowedModels []string          `json:"allowed_models,omitempty"`
	Quota         Quota             `json:"quota,omitempty"`
	Adapters      map[string]string `json:"adapters,omitempty"`
	// TTFTObjective is the time-to-first-token objective of the tenant's
	// requests that carry none (0: the model's, if any).
	TTFTObjective Duration `json:"ttft_objective,omitempty"`
	// ShareWeight weighs the tenant's fair share of a shedding pool's
	// in-flight tokens against the other tenants' (nil: 1).
	ShareWeight *float64 `json:"share_weight,omitempty"`
	// Budget is the tenant's spend budget (nil: none).
	Budget *Budget `json:"budget,omitempty"`
	// Regions, when set, are the only regions the tenant's requests may
	// be served in, spill included (residency). Nil: anywhere; an empty
	// list is refused.
	Regions []string `json:"regions,omitempty"`
}

// Share weights a tenant may be given, and the weight of one that sets
// none.
const (
	MinShareWeight     = 0.01
	MaxShareWeight     = 1000
	DefaultShareWeight = 1
)

// Weight is the tenant's share weight: ShareWeight, else
// DefaultShareWeight.
func (t *Tenant) Weight() float64 {
	if t == nil || t.ShareWeight == nil {
		return DefaultShareWeight
	}
	return *t.ShareWeight
}

// Key is the value of keys.<sha256 hex of an API key>.
type Key struct {
	Tenant string `json:"tenant"`
	// Budget is the key's own spend budget (nil: none), charged beside
	// its tenant's.
	Budget *Budget `json:"budget,omitempty"`
}

// Replica is the value of replicas.<replica>, written by the adapter.
type Replica struct {
	Model    string `json:"model"`
	Version  string `json:"version,omitempty"`
	Pool     string `json:"pool"`
	Flavor   string `json:"flavor,omitempty"`
	MaxBatch int    `json:"max_batch,omitempty"`
	MaxQueue int    `json:"max_queue,omitempty"`
	MaxLoras int    `json:"max_loras,omitempty"`
	State    string `json:"state"`
	// Role is what the replica serves of a disaggregated model: RoleBoth
	// (the default, ""), RolePrefill or RoleDecode. Written by the adapter
	// from --pd-role.
	Role string `json:"role,omitempty"`
	// Endpoints are the inference endpoints the engine serves (none: the
	// base set, subjects.BaseEndpoints).
	Endpoints []string `json:"endpoints,omitempty"`
}
