package table

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
)

// ErrInvalid wraps every decoding and validation failure.
var ErrInvalid = errors.New("invalid routing table value")

// KeyError names the key (and field) a value failed on.
type KeyError struct {
	Key   string
	Field string
	Err   error
}

func (e *KeyError) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%s: %s: %v", e.Key, e.Field, e.Err)
	}
	return fmt.Sprintf("%s: %v", e.Key, e.Err)
}

func (e *KeyError) Unwrap() []error { return []error{ErrInvalid, e.Err} }

func fieldErr(key, field, format string, a ...any) error {
	return &KeyError{Key: key, Field: field, Err: fmt.Errorf(format, a...)}
}

// Kind is what a key holds.
type Kind int

// Kinds of keys.
const (
	KindUnknown Kind = iota
	KindPolicy
	KindAlias
	KindModel
	KindPool
	KindTenant
	KindKey
	KindReplica
	KindBilling
)

// Split returns the kind of key and the name after its prefix.
func Split(key string) (Kind, string) {
	switch {
	case key == KeyPolicy:
		return KindPolicy, ""
	case key == KeyBilling:
		return KindBilling, ""
	case strings.HasPrefix(key, PrefixAliases):
		return KindAlias, key[len(PrefixAliases):]
	case strings.HasPrefix(key, PrefixModels):
		return KindModel, key[len(PrefixModels):]
	case strings.HasPrefix(key, PrefixPools):
		return KindPool, key[len(PrefixPools):]
	case strings.HasPrefix(key, PrefixTenants):
		return KindTenant, key[len(PrefixTenants):]
	case strings.HasPrefix(key, PrefixKeys):
		return KindKey, key[len(PrefixKeys):]
	case strings.HasPrefix(key, PrefixReplicas):
		return KindReplica, key[len(PrefixReplicas):]
	}
	return KindUnknown, ""
}

// ValidName reports whether s is an alias or model id:
// [A-Za-z0-9_-][A-Za-z0-9._-]{0,127}.
func ValidName(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
		if !ok && (i == 0 || c != '.') {
			return false
		}
	}
	return true
}

func validHex64(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// decodeStrict decodes one JSON value, refusing unknown fields and trailing data.
func decodeStrict(key string, b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &KeyError{Key: key, Err: err}
	}
	if _, err := dec.Token(); err != io.EOF {
		return &KeyError{Key: key, Err: errors.New("trailing data after the JSON value")}
	}
	return nil
}

// Value is one decoded, validated key.
type Value struct {
	Key  string
	Kind Kind
	Name string
	V    any // Policy, Alias, Model, Pool, Tenant, Key or Replica (by value)
}

// Decode decodes and validates the value of key. It is the one gate every KV
// value passes before it can affect routing.
func Decode(key string, b []byte) (Value, error) {
	kind, name := Split(key)
	v := Value{Key: key, Kind: kind, Name: name}
	switch kind {
	case KindPolicy:
		p := DefaultPolicy()
		p.PoolRules = nil
		if err := decodeStrict(key, b, &p); err != nil {
			return v, err
		}
		if p.PoolRules == nil {
			p.PoolRules = DefaultPoolRules()
		}
		v.V = p
		return v, validatePolicy(key, &p)
	case KindAlias:
		if !ValidName(name) {
			return v, fieldErr(key, "", "alias name %q is not [A-Za-z0-9_-][A-Za-z0-9._-]{0,127}", name)
		}
		var a Alias
		if err := decodeStrict(key, b, &a); err != nil {
			return v, err
		}
		err := validateAlias(key, &a)
		v.V = a
		return v, err
	case KindModel:
		if !ValidName(name) {
			return v, fieldErr(key, "", "model id %q is not [A-Za-z0-9_-][A-Za-z0-9._-]{0,127}", name)
		}
		var m Model
		if err := decodeStrict(key, b, &m); err != nil {
			return v, err
		}
		v.V = m
		return v, validateModel(key, &m)
	case KindPool:
		if !ValidName(name) {
			return v, fieldErr(key, "", "pool name %q is invalid", name)
		}
		var p Pool
		if err := decodeStrict(key, b, &p); err != nil {
			return v, err
		}
		v.V = p
		if p.AffinityReleaseThreshold != nil && !unit(*p.AffinityReleaseThreshold) {
			return v, fieldErr(key, "affinity_release_threshold", "must be in [0, 1], got %v", *p.AffinityReleaseThreshold)
		}
		if p.SaturationKV != nil && !unit(*p.SaturationKV) {
			return v, fieldErr(key, "saturation_kv", "must be in [0, 1], got %v", *p.SaturationKV)
		}
		if p.PanicBelow != nil && !unit(*p.PanicBelow) {
			return v, fieldErr(key, "panic_below", "must be in [0, 1], got %v", *p.PanicBelow)
		}
		if !validObjective(p.ShedAfter) {
			return v, fieldErr(key, "shed_after", "want a duration from %v to %v, got %v", subjects.MinTTFTObjective, subjects.MaxTTFTObjective, time.Duration(p.ShedAfter))
		}
		if err := validateProfile(key, p.Profile); err != nil {
			return v, err
		}
		return v, validateScorers(key, p.Scorers)
	case KindTenant:
		if err := subjects.ValidToken(name); err != nil {
			return v, &KeyError{Key: key, Err: err}
		}
		var t Tenant
		if err := decodeStrict(key, b, &t); err != nil {
			return v, err
		}
		v.V = t
		return v, validateTenant(key, &t)
	case KindKey:
		if !validHex64(name) {
			return v, fieldErr(key, "", "a key must be the lowercase sha256 hex of the API key")
		}
		var k Key
		if err := decodeStrict(key, b, &k); err != nil {
			return v, err
		}
		v.V = k
		if err := subjects.ValidToken(k.Tenant); err != nil {
			return v, &KeyError{Key: key, Field: "tenant", Err: err}
		}
		return v, validateBudget(key, "budget", k.Budget)
	case KindBilling:
		var bl Billing
		if err := decodeStrict(key, b, &bl); err != nil {
			return v, err
		}
		v.V = bl
		if c := bl.Currency; c != "" && !validCurrency(c) {
			return v, fieldErr(key, "currency", "want 1 to 8 letters such as USD, got %q", c)
		}
		return v, nil
	case KindReplica:
		if err := subjects.ValidToken(name); err != nil {
			return v, &KeyError{Key: key, Err: err}
		}
		var r Replica
		if err := decodeStrict(key, b, &r); err != nil {
			return v, err
		}
		v.V = r
		return v, validateReplica(key, &r)
	}
	return v, fieldErr(key, "", "unknown key: want policy, billing, aliases.*, models.*, pools.*, tenants.*, keys.* or replicas.*")
}

// Encode renders a value as indented JSON, as `switchyard table export` and
// operators see it.
func Encode(v any) ([]byte, error) { return json.MarshalIndent(v, "", "  ") }

func unit(f float64) bool { return f >= 0 && f <= 1 }

func validatePolicy(key string, p *Policy) error {
	switch {
	case p.LongContextTokens <= 0:
		return fieldErr(key, "long_context_tokens", "must be positive, got %d", p.LongContextTokens)
	case !unit(p.AffinityReleaseThreshold):
		return fieldErr(key, "affinity_release_threshold", "must be in [0, 1], got %v", p.AffinityReleaseThreshold)
	case !unit(p.SaturationKV):
		return fieldErr(key, "saturation_kv", "must be in [0, 1], got %v", p.SaturationKV)
	case p.LoadWeights.KV < 0 || p.LoadWeights.Queue < 0 || p.LoadWeights.Batch < 0:
		return fieldErr(key, "load_weights", "weights must not be negative")
	case p.PrefixBlockChars < 16 || p.PrefixBlockChars > 1<<16:
		return fieldErr(key, "prefix_block_chars", "must be in [16, 65536], got %d", p.PrefixBlockChars)
	case p.PrefixMaxBlocks < 0 || p.PrefixMaxBlocks > 256:
		return fieldErr(key, "prefix_max_blocks", "must be in [0, 256], got %d", p.PrefixMaxBlocks)
	case p.StaleAfter <= 0:
		return fieldErr(key, "stale_after", "must be positive")
	case p.DeadAfter <= 0:
		return fieldErr(key, "dead_after", "must be positive")
	case !unit(p.DecisionSample):
		return fieldErr(key, "decision_sample", "must be in [0, 1], got %v", p.DecisionSample)
	case p.ReplicaChoice != "" && p.ReplicaChoice != ChoicePowerOfTwo && p.ReplicaChoice != ChoicePredictedTTFT:
		return fieldErr(key, "replica_choice", "want predicted-ttft or power-of-two, got %q", p.ReplicaChoice)
	}
	for i, r := range p.PoolRules {
		switch r.When {
		case WhenLongContext, WhenPremium, WhenBatch, WhenCanary, WhenAlways:
		default:
			return fieldErr(key, fmt.Sprintf("pool_rules[%d].when", i), "unknown condition %q (want long_context, premium, batch, canary or always)", r.When)
		}
		if !ValidName(r.Pool) {
			return fieldErr(key, fmt.Sprintf("pool_rules[%d].pool", i), "invalid pool name %q", r.Pool)
		}
	}
	if err := validateProfile(key, p.Profile); err != nil {
		return err
	}
	if err := validateRegions(key, p.Regions); err != nil {
		return err
	}
	return validateScorers(key, p.Scorers)
}

// validateRegions checks policy.regions: each spill list names regions
// other than its own, each once, and its penalty is in [0, MaxSpillPenalty].
func validateRegions(key string, regions map[string]RegionPolicy) error {
	if len(regions) > MaxRegions {
		return fieldErr(key, "regions", "at most %d regions, got %d", MaxRegions, len(regions))
	}
	for _, from := range slices.Sorted(maps.Keys(regions)) {
		rp := regions[from]
		f := "regions." + from
		if err := subjects.ValidToken(from); err != nil {
			return &KeyError{Key: key, Field: "regions", Err: err}
		}
		if len(rp.Spill) > MaxSpillRegions {
			return fieldErr(key, f+".spill", "at most %d regions, got %d", MaxSpillRegions, len(rp.Spill))
		}
		for i, to := range rp.Spill {
			fi := fmt.Sprintf("%s.spill[%d]", f, i)
			if err := subjects.ValidToken(to); err != nil {
				return &KeyError{Key: key, Field: fi, Err: err}
			}
			if to == from {
				return fieldErr(key, fi, "region %s names itself: a region's own replicas always come first", to)
			}
			if slices.Contains(rp.Spill[:i], to) {
				return fieldErr(key, fi, "region %s is named twice", to)
			}
		}
		if rp.Penalty < 0 || time.Duration(rp.Penalty) > MaxSpillPenalty {
			return fieldErr(key, f+".penalty", "want a duration from 0 to %v, got %v", MaxSpillPenalty, time.Duration(rp.Penalty))
		}
	}
	return nil
}

func validateAlias(key string, a *Alias) error {
	if len(a.Targets) == 0 && len(a.Cascade) == 0 {
		return fieldErr(key, "targets", "an alias needs targets or a cascade")
	}
	if len(a.Targets) > 0 && len(a.Cascade) > 0 {
		return fieldErr(key, "cascade", "an alias has either targets or a cascade, not both")
	}
	total := 0
	for i, t := range a.Targets {
		if !ValidName(t.Model) {
			return fieldErr(key, fmt.Sprintf("targets[%d].model", i), "invalid model id %q", t.Model)
		}
		if t.Weight < 0 {
			return fieldErr(key, fmt.Sprintf("targets[%d].weight", i), "must not be negative")
		}
		total += t.Weight
	}
	if len(a.Targets) > 0 && total <= 0 {
		return fieldErr(key, "targets", "weights must add up to more than 0")
	}
	for i := range a.Cascade {
		r := &a.Cascade[i]
		f := fmt.Sprintf("cascade[%d]", i)
		if !ValidName(r.Alias) {
			return fieldErr(key, f+".alias", "invalid alias %q", r.Alias)
		}
		if r.When.Tier != "" && r.When.Tier != TierPremium && r.When.Tier != TierStandard {
			return fieldErr(key, f+".when.tier", "want standard or premium, got %q", r.When.Tier)
		}
		if r.When.Regex != "" {
			re, err := regexp.Compile(r.When.Regex)
			if err != nil {
				return fieldErr(key, f+".when.regex", "%v", err)
			}
			r.When.re = re
		}
	}
	for i, fb := range a.Fallbacks {
		if !ValidName(fb) {
			return fieldErr(key, fmt.Sprintf("fallbacks[%d]", i), "invalid alias %q", fb)
		}
	}
	return nil
}

func validateModel(key string, m *Model) error {
	if m.Tier != "" && m.Tier != TierHot && m.Tier != TierCold {
		return fieldErr(key, "tier", "want hot or cold, got %q", m.Tier)
	}
	if m.MaxContextTokens < 0 {
		return fieldErr(key, "max_context_tokens", "must not be negative")
	}
	if m.DefaultMaxTokens < 0 {
		return fieldErr(key, "default_max_tokens", "must not be negative")
	}
	if m.Resume != "" && m.Resume != ResumeContinue && m.Resume != ResumeNone {
		return fieldErr(key, "resume", "want continue or none, got %q", m.Resume)
	}
	if m.IdleUnloadAfter < 0 {
		return fieldErr(key, "idle_unload_after", "must not be negative")
	}
	if m.ExpectedLoadSeconds < 0 || m.ExpectedLoadSeconds > 86400 {
		return fieldErr(key, "expected_load_seconds", "must be in [0, 86400], got %v", m.ExpectedLoadSeconds)
	}
	if m.OnCold != "" && m.OnCold != OnColdReject && m.OnCold != OnColdWait {
		return fieldErr(key, "on_cold", "want reject or wait, got %q", m.OnCold)
	}
	if !validObjective(m.TTFTObjective) {
		return fieldErr(key, "ttft_objective", "want a duration from %v to %v, got %v", subjects.MinTTFTObjective, subjects.MaxTTFTObjective, time.Duration(m.TTFTObjective))
	}
	if d := m.Disaggregation; d != nil && (d.MinUncachedTokens < 0 || d.MinUncachedTokens > MaxMinUncachedTokens) {
		return fieldErr(key, "disaggregation.min_uncached_tokens", "must be in [0, %d], got %d", MaxMinUncachedTokens, d.MinUncachedTokens)
	}
	if err := validateAction(key, "load", m.Load); err != nil {
		return err
	}
	if err := validatePrice(key, m.Price); err != nil {
		return err
	}
	return validateAction(key, "unload", m.Unload)
}

// money reports whether f is an amount from 0 to most (NaN is not).
func money(f, most float64) bool { return f >= 0 && f <= most }

func validatePrice(key string, p *Price) error {
	if p == nil {
		return nil
	}
	switch {
	case !money(p.Input, MaxPrice):
		return fieldErr(key, "price.input", "must be an amount from 0 to %g per million tokens, got %v", float64(MaxPrice), p.Input)
	case p.CachedInput != nil && !money(*p.CachedInput, MaxPrice):
		return fieldErr(key, "price.cached_input", "must be an amount from 0 to %g per million tokens, got %v", float64(MaxPrice), *p.CachedInput)
	case !money(p.Output, MaxPrice):
		return fieldErr(key, "price.output", "must be an amount from 0 to %g per million tokens, got %v", float64(MaxPrice), p.Output)
	case p.Batch != nil && !money(*p.Batch, MaxBatchFactor):
		return fieldErr(key, "price.batch", "must be a factor from 0 to %d, got %v", MaxBatchFactor, *p.Batch)
	}
	return nil
}

// validateBudget checks a tenant's or a key's budget (field names it).
func validateBudget(key, field string, b *Budget) error {
	if b == nil {
		return nil
	}
	if !money(b.Limit, MaxBudgetLimit) {
		return fieldErr(key, field+".limit", "must be an amount from 0 to %g, got %v", float64(MaxBudgetLimit), b.Limit)
	}
	if !ValidPeriod(b.Period) {
		return fieldErr(key, field+".period", "want day, week, month or total, got %q", b.Period)
	}
	return nil
}

func validCurrency(c string) bool {
	if len(c) > 8 {
		return false
	}
	for i := 0; i < len(c); i++ {
		if !(c[i] >= 'A' && c[i] <= 'Z' || c[i] >= 'a' && c[i] <= 'z') {
			return false
		}
	}
	return true
}

// k8sName is a DNS-1123 label, what namespaces and Deployments are named.
var k8sName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

func validateAction(key, field string, a *Action) error {
	if a == nil {
		return nil
	}
	n := 0
	if len(a.Exec) > 0 {
		n++
		if a.Exec[0] == "" {
			return fieldErr(key, field+".exec", "the first element must be the program")
		}
	}
	if a.Webhook != "" {
		n++
		if !strings.HasPrefix(a.Webhook, "http://") && !strings.HasPrefix(a.Webhook, "https://") {
			return fieldErr(key, field+".webhook", "want an http:// or https:// URL, got %q", a.Webhook)
		}
	}
	if k := a.Kubernetes; k != nil {
		n++
		if !k8sName.MatchString(k.Namespace) {
			return fieldErr(key, field+".kubernetes.namespace", "invalid namespace %q", k.Namespace)
		}
		if len(k.Deployment) > 253 || !k8sName.MatchString(k.Deployment) {
			return fieldErr(key, field+".kubernetes.deployment", "invalid deployment name %q", k.Deployment)
		}
		if k.Replicas < 0 || k.Replicas > 1000 {
			return fieldErr(key, field+".kubernetes.replicas", "must be in [0, 1000], got %d", k.Replicas)
		}
	}
	if n != 1 {
		return fieldErr(key, field, "want exactly one of exec, webhook or kubernetes")
	}
	return nil
}

func validateTenant(key string, t *Tenant) error {
	if t.Tier != "" && t.Tier != TierPremium && t.Tier != TierStandard {
		return fieldErr(key, "tier", "want standard or premium, got %q", t.Tier)
	}
	if t.Quota.RPM < 0 || t.Quota.TPM < 0 {
		return fieldErr(key, "quota", "limits must not be negative")
	}
	if !validObjective(t.TTFTObjective) {
		return fieldErr(key, "ttft_objective", "want a duration from %v to %v, got %v", subjects.MinTTFTObjective, subjects.MaxTTFTObjective, time.Duration(t.TTFTObjective))
	}
	if w := t.ShareWeight; w != nil && !(*w >= MinShareWeight && *w <= MaxShareWeight) {
		return fieldErr(key, "share_weight", "must be in [%v, %v], got %v", MinShareWeight, MaxShareWeight, *w)
	}
	for alias, lora := range t.Adapters {
		if !ValidName(alias) || !ValidName(lora) {
			return fieldErr(key, "adapters", "invalid entry %q → %q", alias, lora)
		}
	}
	if t.Regions != nil {
		if len(t.Regions) == 0 {
			return fieldErr(key, "regions", "an empty list would serve the tenant nowhere: list its regions, or leave the field out to serve it anywhere")
		}
		if len(t.Regions) > MaxRegions {
			return fieldErr(key, "regions", "at most %d regions, got %d", MaxRegions, len(t.Regions))
		}
		for i, r := range t.Regions {
			fi := fmt.Sprintf("regions[%d]", i)
			if err := subjects.ValidToken(r); err != nil {
				return &KeyError{Key: key, Field: fi, Err: err}
			}
			if slices.Contains(t.Regions[:i], r) {
				return fieldErr(key, fi, "region %s is named twice", r)
			}
		}
	}
	return validateBudget(key, "budget", t.Budget)
}

// validObjective reports whether a table's TTFT objective (or a pool's
// shed_after) is unset or in the range a request's objective may take.
func validObjective(d Duration) bool {
	return d == 0 || time.Duration(d) >= subjects.MinTTFTObjective && time.Duration(d) <= subjects.MaxTTFTObjective
}

func validateReplica(key string, r *Replica) error {
	switch {
	case !ValidName(r.Model):
		return fieldErr(key, "model", "invalid model id %q", r.Model)
	case !ValidName(r.Pool):
		return fieldErr(key, "pool", "invalid pool %q", r.Pool)
	case !subjects.ValidState(r.State):
		return fieldErr(key, "state", "want loading, ready, draining or disabled, got %q", r.State)
	case r.MaxBatch < 0 || r.MaxQueue < 0 || r.MaxLoras < 0:
		return fieldErr(key, "max_batch", "sizes must not be negative")
	case !ValidRole(r.Role):
		return fieldErr(key, "role", "want prefill, decode or both, got %q", r.Role)
	}
	for _, e := range r.Endpoints {
		if subjects.EndpointBit(e) == 0 {
			return fieldErr(key, "endpoints", "unknown endpoint %q", e)
		}
	}
	return nil
}
