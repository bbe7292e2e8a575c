package table_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/switchyard-llm/switchyard/deploy/examples"
	"github.com/switchyard-llm/switchyard/table"
)

func devFlat(t *testing.T) map[string]json.RawMessage {
	t.Helper()
	flat, errs := table.ParseFlat(examples.Table())
	for _, err := range errs {
		t.Errorf("dev table: %v", err)
	}
	if flat == nil {
		t.Fatal("dev table did not parse")
	}
	return flat
}

// Every value of deploy/examples/table.json is valid, and the snapshot built
// from it is the dev table the README describes.
func TestDevTable(t *testing.T) {
	flat := devFlat(t)
	s, errs := table.FromFlat(flat)
	if len(errs) > 0 {
		t.Fatalf("FromFlat: %v", errs)
	}
	if len(s.Raw) != len(flat) {
		t.Errorf("snapshot has %d of %d keys", len(s.Raw), len(flat))
	}
	if !s.Policy.AllowAnonymous || s.Policy.LongContextTokens != 16000 || len(s.Policy.PoolRules) != 4 {
		t.Errorf("policy = %+v", s.Policy)
	}

	for _, a := range []string{"chat-large", "chat-small", "code", "auto", "mixtral"} {
		if s.Aliases[a] == nil {
			t.Errorf("alias %s missing", a)
		}
	}
	cl := s.Aliases["chat-large"]
	if len(cl.Targets) != 2 || cl.Targets[0].Weight != 95 || cl.Targets[1].Version != "v1.6.0" || cl.Targets[1].Weight != 5 {
		t.Errorf("chat-large = %+v", cl)
	}
	auto := s.Aliases["auto"]
	if len(auto.Cascade) != 3 || !slices.Equal(auto.Cascade[0].When.Features, []string{"code"}) ||
		*auto.Cascade[1].When.MaxPromptTokens != 200 || auto.Cascade[2].Alias != "chat-large" {
		t.Errorf("auto = %+v", auto)
	}

	if m := s.Models["llama-3-70b-instruct"]; m == nil || m.MaxContextTokens != 131072 || m.Tier != table.TierHot {
		t.Errorf("llama-3-70b-instruct = %+v", m)
	}
	if m := s.Models["qwen-coder-32b"]; m == nil || m.MaxContextTokens != 32768 {
		t.Errorf("qwen-coder-32b = %+v", m)
	}
	if m := s.Models["mixtral-8x22b"]; m == nil || m.Tier != table.TierCold {
		t.Errorf("mixtral-8x22b = %+v", m)
	}

	tenants := map[string]string{"default": "standard", "acme": "premium", "team-x": "standard", "intern": "standard", "trial": "standard"}
	for name, tier := range tenants {
		if tn := s.Tenants[name]; tn == nil || tn.Tier != tier {
			t.Errorf("tenant %s = %+v, want tier %s", name, tn, tier)
		}
	}
	if got := s.Tenants["team-x"].Adapters["chat-small"]; got != "team-x-v3" {
		t.Errorf("team-x adapter = %q", got)
	}
	if !slices.Equal(s.Tenants["intern"].AllowedModels, []string{"chat-small"}) || s.Tenants["trial"].Quota.RPM != 5 {
		t.Error("intern or trial restrictions lost")
	}

	// The dev API keys are stored as their sha256 only.
	for key, tenant := range map[string]string{"sk-acme-dev": "acme", "sk-teamx-dev": "team-x", "sk-intern-dev": "intern", "sk-trial-dev": "trial", "sk-default-dev": "default"} {
		sum := sha256.Sum256([]byte(key))
		if got := s.Keys[hex.EncodeToString(sum[:])]; got.Tenant != tenant {
			t.Errorf("key %s → %q, want %s", key, got.Tenant, tenant)
		}
	}
	if len(s.Replicas) != 0 {
		t.Errorf("the table file has replicas: adapters register them")
	}

	if rel, sat := s.PoolOverrides(table.PoolBatch); rel != 0.95 || sat != 0.98 {
		t.Errorf("batch overrides = %v, %v", rel, sat)
	}
	if rel, sat := s.PoolOverrides(table.PoolLongContext); rel != 0.9 || sat != 0.95 {
		t.Errorf("long-context overrides = %v, %v", rel, sat)
	}
	if rel, sat := s.PoolOverrides(table.PoolGeneral); rel != 0.85 || sat != 0.95 {
		t.Errorf("general = %v, %v", rel, sat)
	}
}

// Each dev value survives Encode and Decode unchanged: what `table export`
// prints, `table import` reads back.
func TestEncodeRoundTrip(t *testing.T) {
	for key, raw := range devFlat(t) {
		v, err := table.Decode(key, raw)
		if err != nil {
			t.Fatal(err)
		}
		b, err := table.Encode(v.V)
		if err != nil {
			t.Fatal(err)
		}
		v2, err := table.Decode(key, b)
		if err != nil {
			t.Fatalf("%s: encoded value does not decode: %v\n%s", key, err, b)
		}
		b2, _ := table.Encode(v2.V)
		if string(b) != string(b2) {
			t.Errorf("%s changed on a round trip:\n%s\n%s", key, b, b2)
		}
	}
}

func TestParseFlatReportsEachBadValue(t *testing.T) {
	if _, errs := table.ParseFlat([]byte(`{"policy": {}`)); len(errs) != 1 || !errors.Is(errs[0], table.ErrInvalid) {
		t.Errorf("truncated file: %v", errs)
	}
	if _, errs := table.ParseFlat([]byte(`[]`)); len(errs) != 1 {
		t.Errorf("array file: %v", errs)
	}
	flat, errs := table.ParseFlat([]byte(`{"models.a": {}, "models.b": {"tier": "x"}, "bogus": {}, "tenants.t": {"tier": "premium"}}`))
	if len(flat) != 4 {
		t.Errorf("flat has %d keys", len(flat))
	}
	var keys []string
	for _, err := range errs {
		var ke *table.KeyError
		if !errors.As(err, &ke) {
			t.Fatalf("not a KeyError: %v", err)
		}
		keys = append(keys, ke.Key)
	}
	if !slices.Equal(keys, []string{"bogus", "models.b"}) {
		t.Errorf("errors name %v, want bogus and models.b in order", keys)
	}

	s, errs := table.FromFlat(flat)
	if len(errs) != 2 {
		t.Errorf("FromFlat errors: %v", errs)
	}
	if got := slices.Sorted(maps.Keys(s.Raw)); !slices.Equal(got, []string{"models.a", "tenants.t"}) {
		t.Errorf("FromFlat kept %v", got)
	}
}

func TestSnapshotCloneSetDelete(t *testing.T) {
	s, errs := table.FromFlat(devFlat(t))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	s.Revision = 7
	c := s.Clone()
	set := func(key, raw string) {
		t.Helper()
		v, err := table.Decode(key, []byte(raw))
		if err != nil {
			t.Fatal(err)
		}
		c.Set(v, []byte(raw))
	}
	set("models.new", `{"tier": "cold"}`)
	set("policy", `{"long_context_tokens": 1000, "pool_rules": [{"when": "always", "pool": "general"}]}`)
	set("replicas.r1", `{"model": "m", "pool": "general", "state": "ready"}`)
	c.Delete("tenants.acme")
	c.Delete("keys.eb62f102b47160ce1588bde4fd8784c43f691ab45303f6efe78e1e772065d72e")
	c.Revision = 8

	if s.Models["new"] != nil || s.Policy.LongContextTokens != 16000 || len(s.Policy.PoolRules) != 4 || s.Tenants["acme"] == nil ||
		len(s.Keys) != 5 || len(s.Replicas) != 0 || s.Revision != 7 || s.Raw["models.new"] != nil {
		t.Error("changing a clone changed the original")
	}
	if c.Models["new"] == nil || c.Policy.LongContextTokens != 1000 || c.Tenants["acme"] != nil || len(c.Keys) != 4 ||
		c.Replicas["r1"] == nil || c.Raw["tenants.acme"] != nil || c.Raw["replicas.r1"] == nil {
		t.Error("clone not changed")
	}

	c.Delete("policy")
	if c.Policy.LongContextTokens != table.DefaultPolicy().LongContextTokens || c.Raw["policy"] != nil {
		t.Error("deleting policy does not restore the default")
	}
	// Set keeps its own copy of the raw bytes.
	raw := []byte(`{"tier": "hot"}`)
	v, _ := table.Decode("models.own", raw)
	c.Set(v, raw)
	raw[2] = 'X'
	if string(c.Raw["models.own"]) != `{"tier": "hot"}` {
		t.Error("Set aliases the caller's bytes")
	}
}

func TestNewSnapshotIsEmptyWithDefaultPolicy(t *testing.T) {
	s := table.NewSnapshot()
	if len(s.Raw) != 0 || s.Revision != 0 || s.Policy.LongContextTokens != 16000 || s.Aliases == nil || s.Replicas == nil {
		t.Errorf("NewSnapshot = %+v", s)
	}
	if rel, sat := s.PoolOverrides("anything"); rel != 0.85 || sat != 0.95 {
		t.Errorf("PoolOverrides = %v, %v", rel, sat)
	}
}
