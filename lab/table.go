package lab

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/switchyard-llm/switchyard/enginesim"
	"github.com/switchyard-llm/switchyard/table"
)

// Replica is one simulated replica: an enginesim model registered in a
// pool.
type Replica struct {
	ID     string
	Pool   string
	Engine enginesim.Config
	// Role is what the replica serves of a disaggregated model
	// (table.RolePrefill, table.RoleDecode; "" for both).
	Role string
}

// replicas returns n replicas named prefix-0… in pool, each with cfg.
func replicas(prefix, pool string, n int, cfg enginesim.Config) []Replica {
	out := make([]Replica, n)
	for i := range out {
		out[i] = Replica{ID: fmt.Sprintf("%s-%d", prefix, i), Pool: pool, Engine: cfg}
	}
	return out
}

// BuildTable makes the routing table of a run: the alias Model → ModelID,
// the replicas registered ready, and the extra keys (a "policy" value names
// only the fields it changes). Every value goes through table.Decode, the
// gate the KV watcher uses, so a lab table is a table a broker accepts.
func BuildTable(reps []Replica, extra map[string]any) (*table.Snapshot, error) {
	flat := map[string]any{
		"aliases." + Model:   map[string]any{"targets": []any{map[string]any{"model": ModelID, "version": Version, "weight": 100}}},
		"models." + ModelID:  map[string]any{"versions": []string{Version}, "tier": "hot", "max_context_tokens": 131072, "default_max_tokens": 1024},
		"tenants.default":    map[string]any{"tier": "standard"},
		table.KeyPolicy:      map[string]any{},
		"pools.long-context": map[string]any{"affinity_release_threshold": 0.9},
	}
	for _, r := range reps {
		c := r.Engine.WithDefaults()
		reg := map[string]any{
			"model": ModelID, "version": Version, "pool": r.Pool, "flavor": "enginesim",
			"max_batch": c.MaxBatch, "max_queue": c.MaxQueue, "max_loras": c.MaxLoras, "state": "ready",
		}
		if r.Role != "" {
			reg["role"] = r.Role
		}
		flat["replicas."+r.ID] = reg
	}
	maps.Copy(flat, extra)
	s := table.NewSnapshot()
	for _, k := range slices.Sorted(maps.Keys(flat)) {
		raw, err := json.Marshal(flat[k])
		if err != nil {
			return nil, fmt.Errorf("lab table %s: %w", k, err)
		}
		v, err := table.Decode(k, raw)
		if err != nil {
			return nil, fmt.Errorf("lab table: %w", err)
		}
		s.Set(v, raw)
	}
	return s, nil
}

// adapterTenants is the tenants key of n tenants t00… each mapping Model
// to its own adapter lora-00…, as a team with a fine-tune would.
func adapterTenants(n int) map[string]any {
	out := map[string]any{}
	for i := range n {
		out[fmt.Sprintf("tenants.t%02d", i)] = map[string]any{
			"tier": "standard", "adapters": map[string]string{Model: fmt.Sprintf("lora-%02d", i)},
		}
	}
	return out
}

func ids(reps []Replica) []string {
	out := make([]string, len(reps))
	for i, r := range reps {
		out[i] = r.ID
	}
	return out
}
