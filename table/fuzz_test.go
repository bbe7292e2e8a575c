package table_test

import (
	"errors"
	"testing"

	"github.com/switchyard-llm/switchyard/deploy/examples"
	"github.com/switchyard-llm/switchyard/table"
)

// FuzzDecode checks the gate every KV value passes: Decode never panics,
// every rejection is a KeyError naming the key and wrapping ErrInvalid, and
// every accepted value survives Encode and Decode unchanged.
func FuzzDecode(f *testing.F) {
	flat, _ := table.ParseFlat(examples.Table())
	for k, v := range flat {
		f.Add(k, []byte(v))
	}
	for _, seed := range [][2]string{
		{"policy", `{}`},
		{"policy", `{"pool_rules": []}`},
		{"policy", `{"stale_after": "1h2m3.5s", "decision_sample": 0.25}`},
		{"policy", `{"long_context": 1}`},
		{"aliases.a", `{"cascade": [{"when": {"regex": "(a|b", "tier": "premium"}, "alias": "x"}]}`},
		{"aliases.a", `{"targets": [{"model": "m", "weight": 1}]} trailing`},
		{"models.m", `{"versions": ["v1", "v2"], "max_context_tokens": 1e3}`},
		{"pools.p", `{"saturation_kv": 1}`},
		{"tenants.t", `{"adapters": {"a": "b"}, "quota": {"rpm": 1, "tpm": 2}}`},
		{"keys.0000000000000000000000000000000000000000000000000000000000000000", `{"tenant": "t"}`},
		{"replicas.r", `{"model": "m", "pool": "p", "state": "loading"}`},
		{"nope", `null`},
		{"models.m", `null`},
	} {
		f.Add(seed[0], []byte(seed[1]))
	}
	f.Fuzz(func(t *testing.T, key string, value []byte) {
		v, err := table.Decode(key, value)
		if err != nil {
			var ke *table.KeyError
			if !errors.As(err, &ke) || ke.Key != key || !errors.Is(err, table.ErrInvalid) {
				t.Fatalf("Decode(%q, %q): error %T %v does not name the key", key, value, err, err)
			}
			return
		}
		b, err := table.Encode(v.V)
		if err != nil {
			t.Fatalf("Encode of an accepted value: %v", err)
		}
		v2, err := table.Decode(key, b)
		if err != nil {
			t.Fatalf("Decode(%q, %q) accepted, but its encoding %s is rejected: %v", key, value, b, err)
		}
		b2, err := table.Encode(v2.V)
		if err != nil || string(b2) != string(b) {
			t.Fatalf("round trip changed %q:\n%s\n%s", key, b, b2)
		}
		s := table.NewSnapshot()
		s.Set(v, value)
		if _, ok := s.Raw[key]; !ok {
			t.Fatalf("Set did not keep %q", key)
		}
		s.Delete(key)
		if _, ok := s.Raw[key]; ok {
			t.Fatalf("Delete did not remove %q", key)
		}
	})
}
