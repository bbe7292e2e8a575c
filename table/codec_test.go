package table_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

const hexKey = "keys.eb62f102b47160ce1588bde4fd8784c43f691ab45303f6efe78e1e772065d72e"

// bad is a value Decode must reject, naming key and field.
type bad struct {
	name  string
	key   string
	value string
	field string // KeyError.Field; "" when the value does not decode
	msg   string // part of the message
}

func checkRejected(t *testing.T, tc bad) {
	t.Helper()
	_, err := table.Decode(tc.key, []byte(tc.value))
	if err == nil {
		t.Fatalf("Decode(%s, %s) accepted an invalid value", tc.key, tc.value)
	}
	if !errors.Is(err, table.ErrInvalid) {
		t.Errorf("error does not wrap ErrInvalid: %v", err)
	}
	var ke *table.KeyError
	if !errors.As(err, &ke) {
		t.Fatalf("error is not a KeyError: %T %v", err, err)
	}
	if ke.Key != tc.key {
		t.Errorf("KeyError.Key = %q, want %q", ke.Key, tc.key)
	}
	if ke.Field != tc.field {
		t.Errorf("KeyError.Field = %q, want %q (%v)", ke.Field, tc.field, err)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, tc.key+": ") {
		t.Errorf("message %q does not start with the key", msg)
	}
	if tc.field != "" && !strings.Contains(msg, ": "+tc.field+": ") {
		t.Errorf("message %q does not name the field %s", msg, tc.field)
	}
	if !strings.Contains(msg, tc.msg) {
		t.Errorf("message %q does not say %q", msg, tc.msg)
	}
}

func TestDecodeRejects(t *testing.T) {
	tests := []bad{
		// Strict decoding, any key.
		{name: "unknown field", key: "policy", value: `{"long_context": 1}`, msg: `unknown field "long_context"`},
		{name: "unknown nested field", key: "policy", value: `{"load_weights": {"kv": 1, "gpu": 1}}`, msg: `unknown field "gpu"`},
		{name: "wrong type", key: "policy", value: `{"long_context_tokens": "many"}`, msg: "cannot unmarshal string"},
		{name: "wrong type bool", key: "policy", value: `{"allow_anonymous": "yes"}`, msg: "cannot unmarshal"},
		{name: "trailing value", key: "models.m", value: `{} {}`, msg: "trailing data"},
		{name: "trailing garbage", key: "models.m", value: `{}x`, msg: "trailing data"},
		{name: "not an object", key: "models.m", value: `[1]`, msg: "cannot unmarshal array"},
		{name: "empty", key: "models.m", value: ``, msg: "EOF"},
		{name: "truncated", key: "tenants.t", value: `{"tier": "premium"`, msg: "EOF"},
		{name: "unknown key", key: "routes.x", value: `{}`, msg: "unknown key"},
		{name: "prefix without dot", key: "aliases", value: `{}`, msg: "unknown key"},

		// Cold models: load actions and the wait.
		{name: "two load actions", key: "models.m", value: `{"load": {"exec": ["/bin/true"], "webhook": "http://x"}}`, field: "load", msg: "exactly one"},
		{name: "empty load action", key: "models.m", value: `{"unload": {}}`, field: "unload", msg: "exactly one"},
		{name: "exec without program", key: "models.m", value: `{"load": {"exec": [""]}}`, field: "load.exec", msg: "program"},
		{name: "webhook not http", key: "models.m", value: `{"load": {"webhook": "file:///etc/passwd"}}`, field: "load.webhook", msg: "http"},
		{name: "kubernetes bad namespace", key: "models.m", value: `{"load": {"kubernetes": {"namespace": "Bad_NS", "deployment": "d"}}}`, field: "load.kubernetes.namespace", msg: "invalid"},
		{name: "kubernetes bad replicas", key: "models.m", value: `{"load": {"kubernetes": {"namespace": "ml", "deployment": "d", "replicas": -1}}}`, field: "load.kubernetes.replicas", msg: "[0, 1000]"},
		{name: "on_cold unknown", key: "models.m", value: `{"on_cold": "queue"}`, field: "on_cold", msg: "reject or wait"},
		{name: "idle negative", key: "models.m", value: `{"idle_unload_after": "-1m"}`, field: "idle_unload_after", msg: "negative"},
		{name: "expected load negative", key: "models.m", value: `{"expected_load_seconds": -1}`, field: "expected_load_seconds", msg: "[0, 86400]"},

		// Policy ranges.
		{name: "long context zero", key: "policy", value: `{"long_context_tokens": 0}`, field: "long_context_tokens", msg: "positive"},
		{name: "release above 1", key: "policy", value: `{"affinity_release_threshold": 1.5}`, field: "affinity_release_threshold", msg: "[0, 1]"},
		{name: "release negative", key: "policy", value: `{"affinity_release_threshold": -0.1}`, field: "affinity_release_threshold", msg: "[0, 1]"},
		{name: "saturation above 1", key: "policy", value: `{"saturation_kv": 2}`, field: "saturation_kv", msg: "[0, 1]"},
		{name: "negative weight", key: "policy", value: `{"load_weights": {"kv": -0.6, "queue": 0.3, "batch": 0.1}}`, field: "load_weights", msg: "negative"},
		{name: "block chars small", key: "policy", value: `{"prefix_block_chars": 8}`, field: "prefix_block_chars", msg: "[16, 65536]"},
		{name: "block chars large", key: "policy", value: `{"prefix_block_chars": 70000}`, field: "prefix_block_chars", msg: "[16, 65536]"},
		{name: "max blocks", key: "policy", value: `{"prefix_max_blocks": 257}`, field: "prefix_max_blocks", msg: "[0, 256]"},
		{name: "stale zero", key: "policy", value: `{"stale_after": "0s"}`, field: "stale_after", msg: "positive"},
		{name: "dead negative", key: "policy", value: `{"dead_after": "-1s"}`, field: "dead_after", msg: "positive"},
		{name: "duration as number", key: "policy", value: `{"stale_after": 5}`, msg: "duration string"},
		{name: "duration garbage", key: "policy", value: `{"dead_after": "soon"}`, msg: "invalid duration"},
		{name: "sample above 1", key: "policy", value: `{"decision_sample": 1.01}`, field: "decision_sample", msg: "[0, 1]"},
		{name: "pool rule condition", key: "policy", value: `{"pool_rules": [{"when": "batch", "pool": "batch"}, {"when": "sometimes", "pool": "general"}]}`, field: "pool_rules[1].when", msg: `"sometimes"`},
		{name: "pool rule pool", key: "policy", value: `{"pool_rules": [{"when": "always", "pool": "not a pool"}]}`, field: "pool_rules[0].pool", msg: "invalid pool name"},
		{name: "pool rule empty pool", key: "policy", value: `{"pool_rules": [{"when": "premium"}]}`, field: "pool_rules[0].pool", msg: "invalid pool name"},
		{name: "pool rules wrong type", key: "policy", value: `{"pool_rules": {"when": "premium"}}`, msg: "cannot unmarshal object"},

		// Names in keys.
		{name: "alias empty name", key: "aliases.", value: `{"targets": [{"model": "m", "weight": 1}]}`, msg: "alias name"},
		{name: "alias leading dot", key: "aliases..x", value: `{"targets": [{"model": "m", "weight": 1}]}`, msg: "alias name"},
		{name: "alias colon", key: "aliases.m:lora", value: `{"targets": [{"model": "m", "weight": 1}]}`, msg: "alias name"},
		{name: "alias too long", key: "aliases." + strings.Repeat("a", 129), value: `{"targets": [{"model": "m", "weight": 1}]}`, msg: "alias name"},
		{name: "model space", key: "models.a b", value: `{}`, msg: "model id"},
		{name: "model slash", key: "models.org/m", value: `{}`, msg: "model id"},
		{name: "pool name", key: "pools.gen*", value: `{}`, msg: "pool name"},
		{name: "tenant with dot", key: "tenants.a.b", value: `{}`, msg: "invalid subject token"},
		{name: "tenant too long", key: "tenants." + strings.Repeat("t", 65), value: `{}`, msg: "1 to 64"},
		{name: "replica with dot", key: "replicas.r.1", value: `{"model": "m", "pool": "general", "state": "ready"}`, msg: "invalid subject token"},
		{name: "key upper hex", key: strings.ToUpper(hexKey[:5]) + hexKey[5:], value: `{"tenant": "acme"}`, msg: "unknown key"},
		{name: "key upper digits", key: "keys." + strings.ToUpper(hexKey[5:]), value: `{"tenant": "acme"}`, msg: "sha256"},
		{name: "key short", key: "keys.abc123", value: `{"tenant": "acme"}`, msg: "sha256"},
		{name: "key not hex", key: "keys." + strings.Repeat("g", 64), value: `{"tenant": "acme"}`, msg: "sha256"},

		// Aliases.
		{name: "alias empty", key: "aliases.a", value: `{}`, field: "targets", msg: "targets or a cascade"},
		{name: "alias both", key: "aliases.a", value: `{"targets": [{"model": "m", "weight": 1}], "cascade": [{"when": {}, "alias": "b"}]}`, field: "cascade", msg: "not both"},
		{name: "target model", key: "aliases.a", value: `{"targets": [{"model": "m:x", "weight": 1}]}`, field: "targets[0].model", msg: "invalid model id"},
		{name: "negative weight", key: "aliases.a", value: `{"targets": [{"model": "m", "weight": 5}, {"model": "n", "weight": -1}]}`, field: "targets[1].weight", msg: "negative"},
		{name: "zero weights", key: "aliases.a", value: `{"targets": [{"model": "m", "weight": 0}]}`, field: "targets", msg: "more than 0"},
		{name: "weight not int", key: "aliases.a", value: `{"targets": [{"model": "m", "weight": 0.5}]}`, msg: "cannot unmarshal number 0.5"},
		{name: "cascade alias", key: "aliases.a", value: `{"cascade": [{"when": {}, "alias": ""}]}`, field: "cascade[0].alias", msg: "invalid alias"},
		{name: "cascade tier", key: "aliases.a", value: `{"cascade": [{"when": {"tier": "gold"}, "alias": "b"}]}`, field: "cascade[0].when.tier", msg: `"gold"`},
		{name: "bad regex", key: "aliases.a", value: `{"cascade": [{"when": {}, "alias": "b"}, {"when": {"regex": "(unclosed"}, "alias": "c"}]}`, field: "cascade[1].when.regex", msg: "missing closing )"},
		{name: "cascade unknown condition", key: "aliases.a", value: `{"cascade": [{"when": {"language": "go"}, "alias": "b"}]}`, msg: `unknown field "language"`},
		{name: "fallback", key: "aliases.a", value: `{"targets": [{"model": "m", "weight": 1}], "fallbacks": ["ok", "no way"]}`, field: "fallbacks[1]", msg: "invalid alias"},

		// Models, pools, tenants, keys, replicas.
		{name: "model tier", key: "models.m", value: `{"tier": "warm"}`, field: "tier", msg: `"warm"`},
		{name: "model context", key: "models.m", value: `{"max_context_tokens": -1}`, field: "max_context_tokens", msg: "negative"},
		{name: "model max tokens", key: "models.m", value: `{"default_max_tokens": -5}`, field: "default_max_tokens", msg: "negative"},
		{name: "model versions type", key: "models.m", value: `{"versions": "v1"}`, msg: "cannot unmarshal string"},
		{name: "pool release", key: "pools.batch", value: `{"affinity_release_threshold": 1.2}`, field: "affinity_release_threshold", msg: "[0, 1]"},
		{name: "pool saturation", key: "pools.batch", value: `{"saturation_kv": -0.5}`, field: "saturation_kv", msg: "[0, 1]"},
		{name: "tenant tier", key: "tenants.t", value: `{"tier": "gold"}`, field: "tier", msg: `"gold"`},
		{name: "tenant quota", key: "tenants.t", value: `{"quota": {"rpm": -1}}`, field: "quota", msg: "negative"},
		{name: "tenant adapter", key: "tenants.t", value: `{"adapters": {"chat-small": "bad lora"}}`, field: "adapters", msg: "invalid entry"},
		{name: "tenant adapter alias", key: "tenants.t", value: `{"adapters": {"a:b": "lora"}}`, field: "adapters", msg: "invalid entry"},
		{name: "key tenant missing", key: hexKey, value: `{}`, field: "tenant", msg: "1 to 64"},
		{name: "key tenant bad", key: hexKey, value: `{"tenant": "a.b"}`, field: "tenant", msg: "invalid subject token"},
		{name: "key extra field", key: hexKey, value: `{"tenant": "acme", "key": "sk-acme-dev"}`, msg: `unknown field "key"`},
		{name: "replica state", key: "replicas.r1", value: `{"model": "m", "pool": "general", "state": "busy"}`, field: "state", msg: `"busy"`},
		{name: "replica no state", key: "replicas.r1", value: `{"model": "m", "pool": "general"}`, field: "state", msg: `got ""`},
		{name: "replica model", key: "replicas.r1", value: `{"model": "", "pool": "general", "state": "ready"}`, field: "model", msg: "invalid model id"},
		{name: "replica pool", key: "replicas.r1", value: `{"model": "m", "pool": "a/b", "state": "ready"}`, field: "pool", msg: "invalid pool"},
		{name: "replica role", key: "replicas.r1", value: `{"model": "m", "pool": "general", "state": "ready", "role": "encode"}`, field: "role", msg: `"encode"`},
		{name: "replica role type", key: "replicas.r1", value: `{"model": "m", "pool": "general", "state": "ready", "role": 1}`, msg: "cannot unmarshal number"},
		{name: "disaggregation negative", key: "models.m", value: `{"disaggregation": {"enabled": true, "min_uncached_tokens": -1}}`, field: "disaggregation.min_uncached_tokens", msg: "[0, 4194304]"},
		{name: "disaggregation huge", key: "models.m", value: `{"disaggregation": {"enabled": true, "min_uncached_tokens": 4194305}}`, field: "disaggregation.min_uncached_tokens", msg: "[0, 4194304]"},
		{name: "disaggregation unknown field", key: "models.m", value: `{"disaggregation": {"enabled": true, "threshold": 10}}`, msg: `unknown field "threshold"`},
		{name: "disaggregation enabled type", key: "models.m", value: `{"disaggregation": {"enabled": "yes"}}`, msg: "cannot unmarshal string"},
		{name: "replica choice", key: "policy", value: `{"replica_choice": "least-loaded"}`, field: "replica_choice", msg: `"least-loaded"`},
		{name: "model objective short", key: "models.m", value: `{"ttft_objective": "500us"}`, field: "ttft_objective", msg: "from 1ms to 10m0s"},
		{name: "model objective long", key: "models.m", value: `{"ttft_objective": "11m"}`, field: "ttft_objective", msg: "got 11m0s"},
		{name: "model objective negative", key: "models.m", value: `{"ttft_objective": "-1s"}`, field: "ttft_objective", msg: "got -1s"},
		{name: "model objective number", key: "models.m", value: `{"ttft_objective": 1000}`, msg: "duration"},
		{name: "tenant objective long", key: "tenants.t", value: `{"ttft_objective": "1h"}`, field: "ttft_objective", msg: "got 1h0m0s"},
		{name: "tenant objective garbage", key: "tenants.t", value: `{"ttft_objective": "soon"}`, msg: "soon"},
		{name: "pool shed_after short", key: "pools.general", value: `{"shed_after": "100us"}`, field: "shed_after", msg: "from 1ms to 10m0s"},
		{name: "pool shed_after long", key: "pools.general", value: `{"shed_after": "1h"}`, field: "shed_after", msg: "got 1h0m0s"},
		{name: "pool shed_after number", key: "pools.general", value: `{"shed_after": 500}`, msg: "duration"},
		{name: "pool panic_below over 1", key: "pools.general", value: `{"panic_below": 1.5}`, field: "panic_below", msg: "[0, 1], got 1.5"},
		{name: "pool panic_below negative", key: "pools.general", value: `{"panic_below": -0.1}`, field: "panic_below", msg: "got -0.1"},
		{name: "pool panic_below text", key: "pools.general", value: `{"panic_below": "half"}`, msg: "cannot unmarshal string"},
		{name: "share weight zero", key: "tenants.t", value: `{"share_weight": 0}`, field: "share_weight", msg: "[0.01, 1000], got 0"},
		{name: "share weight negative", key: "tenants.t", value: `{"share_weight": -2}`, field: "share_weight", msg: "got -2"},
		{name: "share weight huge", key: "tenants.t", value: `{"share_weight": 1e6}`, field: "share_weight", msg: "got 1e+06"},
		{name: "share weight text", key: "tenants.t", value: `{"share_weight": "3"}`, msg: "share_weight"},
		{name: "unknown profile", key: "policy", value: `{"profile": "dynamo"}`, field: "profile", msg: `unknown profile "dynamo"`},
		{name: "pool unknown profile", key: "pools.general", value: `{"profile": "sglang"}`, field: "profile", msg: `unknown profile "sglang"`},
		{name: "unknown scorer", key: "policy", value: `{"scorers": {"load_score": 1, "gpu_temp": 1}}`, field: "scorers", msg: `unknown scorer "gpu_temp"`},
		{name: "pool unknown scorer", key: "pools.premium", value: `{"scorers": {"queue_depth": 1}}`, field: "scorers", msg: `unknown scorer "queue_depth"`},
		{name: "negative scorer weight", key: "policy", value: `{"scorers": {"kv_usage": -0.5}}`, field: "scorers.kv_usage", msg: "got -0.5"},
		{name: "pool negative scorer weight", key: "pools.general", value: `{"scorers": {"saturated": -1}}`, field: "scorers.saturated", msg: "got -1"},
		{name: "scorer weight text", key: "policy", value: `{"scorers": {"kv_usage": "1"}}`, msg: "cannot unmarshal string"},
		{name: "spill to itself", key: "policy", value: `{"regions": {"eu": {"spill": ["us", "eu"]}}}`, field: "regions.eu.spill[1]", msg: "names itself"},
		{name: "spill twice", key: "policy", value: `{"regions": {"eu": {"spill": ["us", "ap", "us"]}}}`, field: "regions.eu.spill[2]", msg: "named twice"},
		{name: "spill negative penalty", key: "policy", value: `{"regions": {"eu": {"spill": ["us"], "penalty": "-5ms"}}}`, field: "regions.eu.penalty", msg: "got -5ms"},
		{name: "spill huge penalty", key: "policy", value: `{"regions": {"eu": {"spill": ["us"], "penalty": "1h"}}}`, field: "regions.eu.penalty", msg: "got 1h0m0s"},
		{name: "spill bad region", key: "policy", value: `{"regions": {"eu": {"spill": ["us.east"]}}}`, field: "regions.eu.spill[0]", msg: "letters, digits"},
		{name: "spill bad from", key: "policy", value: `{"regions": {"e u": {"spill": ["us"]}}}`, field: "regions", msg: "letters, digits"},
		{name: "spill unknown field", key: "policy", value: `{"regions": {"eu": {"spill": ["us"], "rtt": "5ms"}}}`, msg: `unknown field "rtt"`},
		{name: "residency empty", key: "tenants.t", value: `{"regions": []}`, field: "regions", msg: "empty list"},
		{name: "residency twice", key: "tenants.t", value: `{"regions": ["eu", "eu"]}`, field: "regions[1]", msg: "named twice"},
		{name: "residency bad region", key: "tenants.t", value: `{"regions": ["eu/west"]}`, field: "regions[0]", msg: "letters, digits"},
		{name: "replica sizes", key: "replicas.r1", value: `{"model": "m", "pool": "general", "state": "ready", "max_queue": -1}`, field: "max_batch", msg: "negative"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { checkRejected(t, tc) })
	}
}

func TestDecodeAccepts(t *testing.T) {
	t.Run("regions", func(t *testing.T) {
		v, err := table.Decode("policy", []byte(`{"regions": {"eu": {"spill": ["us", "ap"], "penalty": "80ms"}, "us": {"spill": ["eu"]}}}`))
		if err != nil {
			t.Fatal(err)
		}
		p := v.V.(table.Policy)
		if eu := p.Regions["eu"]; len(eu.Spill) != 2 || eu.Spill[1] != "ap" || time.Duration(eu.Penalty) != 80*time.Millisecond || p.Regions["us"].Penalty != 0 {
			t.Errorf("regions = %+v", p.Regions)
		}
		v, err = table.Decode("tenants.t", []byte(`{"regions": ["eu"]}`))
		if err != nil {
			t.Fatal(err)
		}
		if tn := v.V.(table.Tenant); len(tn.Regions) != 1 || tn.Regions[0] != "eu" {
			t.Errorf("tenant regions = %v", tn.Regions)
		}
	})
	t.Run("cold model with actions", func(t *testing.T) {
		v, err := table.Decode("models.mixtral-8x22b", []byte(`{"tier": "cold", "on_cold": "wait", "idle_unload_after": "10m",
			"expected_load_seconds": 90, "load": {"kubernetes": {"namespace": "ml", "deployment": "mixtral", "replicas": 2}},
			"unload": {"exec": ["/usr/local/bin/stop", "{model}", "{version}"]}}`))
		if err != nil {
			t.Fatal(err)
		}
		m := v.V.(table.Model)
		if m.OnCold != table.OnColdWait || time.Duration(m.IdleUnloadAfter) != 10*time.Minute || m.ExpectedLoadSeconds != 90 ||
			m.Load == nil || m.Load.Kubernetes == nil || m.Load.Kubernetes.Replicas != 2 || m.Unload == nil || len(m.Unload.Exec) != 3 {
			t.Errorf("model = %+v", m)
		}
	})
	t.Run("profile and scorers", func(t *testing.T) {
		v, err := table.Decode("policy", []byte(`{"profile": "switchyard", "scorers": {"kv_usage": 0.5, "load_score": 0}}`))
		if err != nil {
			t.Fatal(err)
		}
		if p := v.V.(table.Policy); p.Profile != table.ProfileSwitchyard || p.Scorers["kv_usage"] != 0.5 || len(p.Scorers) != 2 {
			t.Errorf("policy = %+v", p)
		}
		v, err = table.Decode("pools.general", []byte(`{"profile": "switchyard", "scorers": {"saturated": 2}}`))
		if err != nil {
			t.Fatal(err)
		}
		s := table.NewSnapshot()
		s.Set(v, nil)
		if got := s.ProfileOf("general"); got != table.ProfileSwitchyard {
			t.Errorf("ProfileOf(general) = %q", got)
		}
		if got := s.ProfileOf("premium"); got != table.ProfileSwitchyard {
			t.Errorf("ProfileOf(premium) = %q, want the default", got)
		}
	})
	t.Run("ttft objectives", func(t *testing.T) {
		v, err := table.Decode("models.m", []byte(`{"ttft_objective": "800ms"}`))
		if err != nil {
			t.Fatal(err)
		}
		if m := v.V.(table.Model); time.Duration(m.TTFTObjective) != 800*time.Millisecond {
			t.Errorf("model objective = %v, want 800ms", time.Duration(m.TTFTObjective))
		}
		v, err = table.Decode("tenants.t", []byte(`{"ttft_objective": "10m"}`))
		if err != nil {
			t.Fatal(err)
		}
		if tn := v.V.(table.Tenant); time.Duration(tn.TTFTObjective) != 10*time.Minute {
			t.Errorf("tenant objective = %v, want 10m", time.Duration(tn.TTFTObjective))
		}
	})
	t.Run("fair shedding", func(t *testing.T) {
		v, err := table.Decode("pools.general", []byte(`{"shed_after": "750ms"}`))
		if err != nil {
			t.Fatal(err)
		}
		if p := v.V.(table.Pool); time.Duration(p.ShedAfter) != 750*time.Millisecond {
			t.Errorf("shed_after = %v, want 750ms", time.Duration(p.ShedAfter))
		}
		v, err = table.Decode("tenants.t", []byte(`{"share_weight": 2.5}`))
		if err != nil {
			t.Fatal(err)
		}
		if tn := v.V.(table.Tenant); tn.Weight() != 2.5 {
			t.Errorf("share weight = %v, want 2.5", tn.Weight())
		}
		v, err = table.Decode("tenants.t", []byte(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		if tn := v.V.(table.Tenant); tn.Weight() != table.DefaultShareWeight {
			t.Errorf("share weight unset = %v, want %v", tn.Weight(), table.DefaultShareWeight)
		}
	})
	t.Run("policy defaults", func(t *testing.T) {
		v, err := table.Decode("policy", []byte(`{"long_context_tokens": 8000, "pool_rules": null}`))
		if err != nil {
			t.Fatal(err)
		}
		p := v.V.(table.Policy)
		want := table.DefaultPolicy()
		want.LongContextTokens = 8000
		if p.LongContextTokens != 8000 || p.SaturationKV != want.SaturationKV || p.LoadWeights != want.LoadWeights ||
			time.Duration(p.StaleAfter) != 5*time.Second || time.Duration(p.DeadAfter) != 15*time.Second {
			t.Errorf("policy = %+v, want defaults but long_context_tokens", p)
		}
		if len(p.PoolRules) != 4 || p.PoolRules[0] != (table.PoolRule{When: table.WhenLongContext, Pool: table.PoolLongContext}) {
			t.Errorf("pool rules = %+v, want the defaults", p.PoolRules)
		}
		if v.Kind != table.KindPolicy || v.Key != "policy" {
			t.Errorf("value = %+v", v)
		}
	})
	t.Run("policy own rules replace the defaults", func(t *testing.T) {
		v, err := table.Decode("policy", []byte(`{"pool_rules": [{"when": "always", "pool": "general"}], "prefix_max_blocks": 0}`))
		if err != nil {
			t.Fatal(err)
		}
		p := v.V.(table.Policy)
		if len(p.PoolRules) != 1 || p.PoolRules[0].When != table.WhenAlways || p.PrefixMaxBlocks != 0 {
			t.Errorf("policy = %+v", p)
		}
	})
	t.Run("policy range edges", func(t *testing.T) {
		edges := `{"affinity_release_threshold": 1, "saturation_kv": 0, "decision_sample": 0, "prefix_block_chars": 16, "prefix_max_blocks": 256,
			"load_weights": {"kv": 0, "queue": 0, "batch": 0}}`
		if _, err := table.Decode("policy", []byte(edges)); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("alias regex compiled", func(t *testing.T) {
		v, err := table.Decode("aliases.auto", []byte(`{"cascade": [{"when": {"regex": "(?i)def |class ", "max_prompt_tokens": 100}, "alias": "code"}, {"when": {}, "alias": "chat"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		a := v.V.(table.Alias)
		if re := a.Cascade[0].When.Re(); re == nil || !re.MatchString("DEF main") {
			t.Errorf("regex not compiled: %v", re)
		}
		if a.Cascade[1].When.Re() != nil {
			t.Error("a rule without regex has one")
		}
		if *a.Cascade[0].When.MaxPromptTokens != 100 {
			t.Error("max_prompt_tokens lost")
		}
	})
	t.Run("names", func(t *testing.T) {
		for _, key := range []string{
			"aliases." + strings.Repeat("a", 128),
			"aliases.llama-3.1_8b",
			"models.-x",
			"models._",
			"models.qwen2.5-coder",
		} {
			if key[:6] == "models" {
				if _, err := table.Decode(key, []byte(`{}`)); err != nil {
					t.Errorf("%s: %v", key, err)
				}
				continue
			}
			if _, err := table.Decode(key, []byte(`{"targets": [{"model": "m", "weight": 1}]}`)); err != nil {
				t.Errorf("%s: %v", key, err)
			}
		}
	})
	t.Run("replica", func(t *testing.T) {
		v, err := table.Decode("replicas.l70-gen-0", []byte(`{"model": "llama-3-70b-instruct", "version": "v1.5.0", "pool": "general", "flavor": "vllm", "max_batch": 32, "max_queue": 128, "max_loras": 4, "state": "draining"}`))
		if err != nil {
			t.Fatal(err)
		}
		if r := v.V.(table.Replica); r.State != subjects.StateDraining || r.MaxLoras != 4 || v.Name != "l70-gen-0" || v.Kind != table.KindReplica {
			t.Errorf("value = %+v", v)
		}
	})
	t.Run("disaggregated model and roles", func(t *testing.T) {
		v, err := table.Decode("models.m", []byte(`{"disaggregation": {"enabled": true, "min_uncached_tokens": 2048}}`))
		if err != nil {
			t.Fatal(err)
		}
		m := v.V.(table.Model)
		if !m.Splits() || m.Disaggregation.MinUncachedTokens != 2048 {
			t.Errorf("model = %+v", m)
		}
		for _, off := range []string{`{"disaggregation": {"enabled": false, "min_uncached_tokens": 2048}}`, `{}`} {
			v, _ := table.Decode("models.m", []byte(off))
			if m := v.V.(table.Model); m.Splits() {
				t.Errorf("%s splits", off)
			}
		}
		for _, role := range []string{"", "both", "prefill", "decode"} {
			v, err := table.Decode("replicas.r1", []byte(`{"model": "m", "pool": "general", "state": "ready", "role": "`+role+`"}`))
			if err != nil {
				t.Fatalf("role %q: %v", role, err)
			}
			if r := v.V.(table.Replica); r.Role != role {
				t.Errorf("role = %q, want %q", r.Role, role)
			}
		}
	})
	t.Run("whitespace around the value", func(t *testing.T) {
		if _, err := table.Decode("models.m", []byte(" \n{\"tier\": \"cold\"}\n ")); err != nil {
			t.Fatal(err)
		}
	})
}

func TestValidName(t *testing.T) {
	for s, want := range map[string]bool{
		"a": true, "A-b_c.d": true, "0": true, "-": true, "_x": true,
		"": false, ".a": false, "a:b": false, "a b": false, "a/b": false, "é": false,
		strings.Repeat("x", 128): true, strings.Repeat("x", 129): false,
	} {
		if got := table.ValidName(s); got != want {
			t.Errorf("ValidName(%q) = %v, want %v", s, got, want)
		}
	}
}

func TestSplit(t *testing.T) {
	for key, want := range map[string]struct {
		kind table.Kind
		name string
	}{
		"policy":      {table.KindPolicy, ""},
		"aliases.a.b": {table.KindAlias, "a.b"},
		"models.m":    {table.KindModel, "m"},
		"pools.p":     {table.KindPool, "p"},
		"tenants.t":   {table.KindTenant, "t"},
		"keys.k":      {table.KindKey, "k"},
		"replicas.r":  {table.KindReplica, "r"},
		"policy.x":    {table.KindUnknown, ""},
		"replica.r":   {table.KindUnknown, ""},
		"":            {table.KindUnknown, ""},
	} {
		kind, name := table.Split(key)
		if kind != want.kind || name != want.name {
			t.Errorf("Split(%q) = %v, %q; want %v, %q", key, kind, name, want.kind, want.name)
		}
	}
}
