package table

import (
	"encoding/json"
	"maps"
	"slices"
	"time"
)

// Snapshot is one consistent view of the routing table. A published snapshot
// is never modified: writers Clone, change the clone, and swap it in.
type Snapshot struct {
	// Revision is the KV revision of the newest value applied.
	Revision uint64
	Policy   Policy
	Aliases  map[string]*Alias
	Models   map[string]*Model
	Pools    map[string]*Pool
	Tenants  map[string]*Tenant
	Keys     map[string]Key
	Replicas map[string]*Replica
	Billing  Billing
	// Raw holds the JSON of every good value by key, for persistence and export.
	Raw map[string]json.RawMessage
}

// NewSnapshot returns an empty table with the default policy.
func NewSnapshot() *Snapshot {
	return &Snapshot{
		Policy:   DefaultPolicy(),
		Aliases:  map[string]*Alias{},
		Models:   map[string]*Model{},
		Pools:    map[string]*Pool{},
		Tenants:  map[string]*Tenant{},
		Keys:     map[string]Key{},
		Replicas: map[string]*Replica{},
		Raw:      map[string]json.RawMessage{},
	}
}

// TenantRules is the entry whose rules tenant follows and whose quota it
// shares, with that entry's name: its own, or for a tenant missing from the
// table the default tenant's (nil when that is missing too).
func (s *Snapshot) TenantRules(tenant string) (*Tenant, string) {
	if t := s.Tenants[tenant]; t != nil {
		return t, tenant
	}
	return s.Tenants[DefaultTenant], DefaultTenant
}

// Clone returns a copy whose maps can be changed without touching s.
func (s *Snapshot) Clone() *Snapshot {
	c := *s
	c.Policy.PoolRules = slices.Clone(s.Policy.PoolRules)
	c.Aliases = maps.Clone(s.Aliases)
	c.Models = maps.Clone(s.Models)
	c.Pools = maps.Clone(s.Pools)
	c.Tenants = maps.Clone(s.Tenants)
	c.Keys = maps.Clone(s.Keys)
	c.Replicas = maps.Clone(s.Replicas)
	c.Raw = maps.Clone(s.Raw)
	return &c
}

// Set applies a decoded value. Only call it on a snapshot not yet published.
func (s *Snapshot) Set(v Value, raw []byte) {
	switch x := v.V.(type) {
	case Policy:
		s.Policy = x
	case Alias:
		s.Aliases[v.Name] = &x
	case Model:
		s.Models[v.Name] = &x
	case Pool:
		s.Pools[v.Name] = &x
	case Tenant:
		s.Tenants[v.Name] = &x
	case Key:
		s.Keys[v.Name] = x
	case Replica:
		s.Replicas[v.Name] = &x
	case Billing:
		s.Billing = x
	default:
		return
	}
	s.Raw[v.Key] = json.RawMessage(slices.Clone(raw))
}

// Delete removes key. Only call it on a snapshot not yet published.
func (s *Snapshot) Delete(key string) {
	kind, name := Split(key)
	switch kind {
	case KindPolicy:
		s.Policy = DefaultPolicy()
	case KindAlias:
		delete(s.Aliases, name)
	case KindModel:
		delete(s.Models, name)
	case KindPool:
		delete(s.Pools, name)
	case KindTenant:
		delete(s.Tenants, name)
	case KindKey:
		delete(s.Keys, name)
	case KindReplica:
		delete(s.Replicas, name)
	case KindBilling:
		s.Billing = Billing{}
	}
	delete(s.Raw, key)
}

// FromFlat builds a snapshot from a flat key → value object (the format of
// deploy/examples/table.json and `switchyard table export`). Invalid values
// are left out and reported, one error each.
func FromFlat(flat map[string]json.RawMessage) (*Snapshot, []error) {
	s := NewSnapshot()
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(flat)) {
		v, err := Decode(k, flat[k])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s.Set(v, flat[k])
	}
	return s, errs
}

// ParseFlat decodes a flat table file and validates every value.
func ParseFlat(b []byte) (map[string]json.RawMessage, []error) {
	var flat map[string]json.RawMessage
	if err := json.Unmarshal(b, &flat); err != nil {
		return nil, []error{&KeyError{Key: "(file)", Err: err}}
	}
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(flat)) {
		if _, err := Decode(k, flat[k]); err != nil {
			errs = append(errs, err)
		}
	}
	return flat, errs
}

// PoolOverrides returns the release threshold and saturation level in force
// for pool.
func (s *Snapshot) PoolOverrides(pool string) (release, saturation float64) {
	release, saturation = s.Policy.AffinityReleaseThreshold, s.Policy.SaturationKV
	if p := s.Pools[pool]; p != nil {
		if p.AffinityReleaseThreshold != nil {
			release = *p.AffinityReleaseThreshold
		}
		if p.SaturationKV != nil {
			saturation = *p.SaturationKV
		}
	}
	return release, saturation
}

// ShedAfter is the predicted time to first token above which pool sheds
// (pools.<pool>.shed_after), 0 when only saturation makes it shed.
func (s *Snapshot) ShedAfter(pool string) time.Duration {
	if p := s.Pools[pool]; p != nil {
		return time.Duration(p.ShedAfter)
	}
	return 0
}

// DefaultPanicBelow is a pool's panic threshold when pools.<pool>.panic_below
// is unset: Envoy's default of 50 %.
const DefaultPanicBelow = 0.5

// PanicBelow is pool's panic threshold (pools.<pool>.panic_below).
func (s *Snapshot) PanicBelow(pool string) float64 {
	if p := s.Pools[pool]; p != nil && p.PanicBelow != nil {
		return *p.PanicBelow
	}
	return DefaultPanicBelow
}

// AliasNames returns the aliases in name order.
func (s *Snapshot) AliasNames() []string { return slices.Sorted(maps.Keys(s.Aliases)) }

// TenantMayUse reports whether tenant may ask for name (an alias, a model id
// or "model:adapter"): true when the tenant has no allowed_models list or the
// list names it.
func (s *Snapshot) TenantMayUse(tenant, name string) bool {
	t := s.Tenants[tenant]
	if t == nil || len(t.AllowedModels) == 0 {
		return true
	}
	return slices.Contains(t.AllowedModels, name)
}

// Currency is the table's currency label.
func (s *Snapshot) Currency() string {
	if s == nil || s.Billing.Currency == "" {
		return DefaultCurrency
	}
	return s.Billing.Currency
}
