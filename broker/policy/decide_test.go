package policy_test

import (
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/subjects"
)

// TestRoutes checks, one rule per case, where an admitted request goes.
func TestRoutes(t *testing.T) {
	tests := []struct {
		name    string
		extra   string
		setup   func(e *env)
		req     func(t testing.TB) *policy.Request
		model   string
		version string
		pool    string
		replica string // "" = any
		reason  string // "" = any; a trailing '*' matches a prefix
		lora    string
	}{
		{
			name: "128k-token request goes to long-context, stable version",
			req: func(testing.TB) *policy.Request {
				q := chat("chat-large")
				q.PromptTokens, q.Conversation = 128000, "conv-a"
				return q
			},
			model: "llama-3-70b-instruct", version: "v1.5.0", pool: "long-context", replica: "l70-long-0",
		},
		{
			name:  "premium tenant goes to premium",
			req:   func(testing.TB) *policy.Request { q := chat("chat-large"); q.Tenant = "acme"; return q },
			model: "llama-3-70b-instruct", version: "v1.5.0", pool: "premium", replica: "l70-prem-0",
		},
		{
			name: "batch priority goes to batch",
			req: func(testing.TB) *policy.Request {
				q := chat("chat-large")
				q.Priority = subjects.PriorityBatch
				return q
			},
			pool:  "batch",
			model: "llama-3-70b-instruct", replica: "l70-batch-0",
		},
		{
			name:  "bare model id is accepted",
			req:   func(testing.TB) *policy.Request { return chat("qwen-coder-32b") },
			model: "qwen-coder-32b", version: "v1.0.0", pool: "general", replica: "coder-gen-0", reason: policy.ReasonOnly,
		},
		{
			name:  "pool without the model falls back to general",
			req:   func(testing.TB) *policy.Request { q := chat("chat-small"); q.Tenant = "acme"; return q },
			model: "llama-3-8b-instruct", pool: "general", reason: policy.ReasonPoolFallback + "+*",
		},
		{
			name:  "unknown tenant gets the default tenant's rules",
			req:   func(testing.TB) *policy.Request { q := chat("chat-small"); q.Tenant = "stranger"; return q },
			model: "llama-3-8b-instruct", pool: "general",
		},
		{
			name: "exclude list avoids a replica",
			req: func(testing.TB) *policy.Request {
				q := chat("chat-large")
				q.Conversation = "any"
				q.Exclude = []string{"l70-gen-0", "l70-canary-0"}
				return q
			},
			model: "llama-3-70b-instruct", replica: "l70-gen-1",
		},
		{
			name:  "cascade: code feature goes to the code alias",
			req:   func(testing.TB) *policy.Request { q := chat("auto"); q.Features = []string{"code"}; return q },
			model: "qwen-coder-32b",
		},
		{
			name:  "cascade: short prompt goes to the small model",
			req:   func(testing.TB) *policy.Request { q := chat("auto"); q.PromptTokens = 200; return q },
			model: "llama-3-8b-instruct",
		},
		{
			name:  "cascade: long prompt goes to the large model",
			req:   func(testing.TB) *policy.Request { q := chat("auto"); q.PromptTokens = 201; return q },
			model: "llama-3-70b-instruct",
		},
		{
			name: "cascade: regex on the prompt",
			extra: `{"aliases.smart": {"cascade": [
				{"when": {"regex": "(?i)\\btranslate\\b"}, "alias": "chat-small"},
				{"when": {}, "alias": "chat-large"}]}}`,
			req: func(testing.TB) *policy.Request {
				q := chat("smart")
				q.Prompt = func() []byte { return []byte("user\nPlease TRANSLATE this\n") }
				return q
			},
			model: "llama-3-8b-instruct",
		},
		{
			name: "cascade: tier rule",
			extra: `{"aliases.tiered": {"cascade": [
				{"when": {"tier": "premium"}, "alias": "chat-large"},
				{"when": {}, "alias": "chat-small"}]}}`,
			req:   func(testing.TB) *policy.Request { q := chat("tiered"); q.Tenant = "acme"; return q },
			model: "llama-3-70b-instruct", pool: "premium",
		},
		{
			name:  "tenant adapter applies to its alias",
			req:   func(testing.TB) *policy.Request { q := chat("chat-small"); q.Tenant = "team-x"; return q },
			model: "llama-3-8b-instruct", lora: "team-x-v3", reason: policy.ReasonLora,
		},
		{
			name: "tenant adapter applies through a cascade",
			req: func(testing.TB) *policy.Request {
				q := chat("auto")
				q.Tenant = "team-x"
				q.PromptTokens = 10
				return q
			},
			model: "llama-3-8b-instruct", lora: "team-x-v3",
		},
		{
			name:  "explicit model:adapter the tenant owns",
			req:   func(testing.TB) *policy.Request { q := chat("chat-small:team-x-v3"); q.Tenant = "team-x"; return q },
			model: "llama-3-8b-instruct", lora: "team-x-v3",
		},
		{
			name:  "explicit model:adapter listed in allowed_models",
			extra: `{"tenants.lab": {"allowed_models": ["llama-3-8b-instruct:exp-1"]}}`,
			req:   func(testing.TB) *policy.Request { q := chat("llama-3-8b-instruct:exp-1"); q.Tenant = "lab"; return q },
			model: "llama-3-8b-instruct", lora: "exp-1",
		},
		{
			name:  "allowed_models listing a model id allows its aliases",
			extra: `{"tenants.lab": {"allowed_models": ["llama-3-8b-instruct"]}}`,
			req:   func(testing.TB) *policy.Request { q := chat("chat-small"); q.Tenant = "lab"; return q },
			model: "llama-3-8b-instruct",
		},
		{
			name:  "fallback when the model has no live replica",
			setup: func(e *env) { e.now = e.now.Add(20 * time.Second); e.beat("l8-gen-0", 0.2, 1, 0) },
			req:   func(testing.TB) *policy.Request { return chat("chat-large") },
			model: "llama-3-8b-instruct", replica: "l8-gen-0", reason: policy.ReasonFallback + "chat-small+" + policy.ReasonOnly,
		},
		{
			name: "fallback chain is followed and loop-safe",
			extra: `{
				"aliases.a": {"targets": [{"model": "ghost", "weight": 1}], "fallbacks": ["b"]},
				"aliases.b": {"targets": [{"model": "ghost", "weight": 1}], "fallbacks": ["a", "b", "code"]},
				"models.ghost": {"tier": "hot"}}`,
			req:   func(testing.TB) *policy.Request { return chat("a") },
			model: "qwen-coder-32b", reason: policy.ReasonFallback + "code+*",
		},
		{
			name:  "canary without a canary replica serves the stable version",
			extra: `{"replicas.l70-canary-0": {"model": "llama-3-70b-instruct", "version": "v1.6.0", "pool": "canary", "state": "disabled"}}`,
			req: func(t testing.TB) *policy.Request {
				q := chat("chat-large")
				q.Conversation = canaryConversation(t)
				return q
			},
			model: "llama-3-70b-instruct", version: "v1.5.0", pool: "general", reason: policy.ReasonCanaryGone + "+*",
		},
		{
			name: "canary drawn goes to the canary pool",
			req: func(t testing.TB) *policy.Request {
				q := chat("chat-large")
				q.Conversation = canaryConversation(t)
				return q
			},
			model: "llama-3-70b-instruct", version: "v1.6.0", pool: "canary", replica: "l70-canary-0",
		},
		{
			name:    "draining replica in the table is not a candidate",
			extra:   `{"replicas.l70-gen-0": {"model": "llama-3-70b-instruct", "version": "v1.5.0", "pool": "general", "state": "draining"}}`,
			req:     func(testing.TB) *policy.Request { q := chat("chat-large"); q.Conversation = "c1"; return q },
			replica: "l70-gen-1",
		},
		{
			name: "draining heartbeat is not a candidate",
			setup: func(e *env) {
				e.beat("l70-gen-1", 0.1, 0, 0, func(h *subjects.Heartbeat) { h.State = subjects.StateDraining })
			},
			req:     func(testing.TB) *policy.Request { q := chat("chat-large"); q.Conversation = "c1"; return q },
			replica: "l70-gen-0",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var extra []string
			if tc.extra != "" {
				extra = append(extra, tc.extra)
			}
			e := newEnv(t, extra...)
			if tc.setup != nil {
				tc.setup(e)
			}
			d := e.decide(tc.req(t))
			mustRoute(t, d)
			check := func(what, got, want string) {
				t.Helper()
				if want == "" {
					return
				}
				if p, ok := strings.CutSuffix(want, "*"); ok && strings.HasPrefix(got, p) {
					return
				}
				if got != want {
					t.Errorf("%s = %q, want %q (decision %+v)", what, got, want, *d)
				}
			}
			check("model", d.Model, tc.model)
			check("version", d.Version, tc.version)
			check("pool", d.Pool, tc.pool)
			check("replica", d.Replica, tc.replica)
			check("reason", d.Reason, tc.reason)
			check("lora", d.Lora, tc.lora)
			if d.TableRevision != 42 {
				t.Errorf("table revision %d", d.TableRevision)
			}
		})
	}
}

// canaryConversation returns a conversation that draws chat-large's canary.
func canaryConversation(t testing.TB) string {
	e := newEnv(t)
	for i := range 1000 {
		q := chat("chat-large")
		q.Conversation = "conv-" + itoa(i)
		if d := e.explain(q); d.Version == "v1.6.0" {
			return q.Conversation
		}
	}
	t.Fatal("no conversation draws the canary")
	return ""
}

func TestCanary(t *testing.T) {
	e := newEnv(t)
	const n = 20000
	canary := 0
	for i := range n {
		q := chat("chat-large")
		q.Conversation = "conv-" + itoa(i)
		d := e.explain(q)
		mustRoute(t, d)
		if d.Version == "v1.6.0" {
			canary++
			if d.Pool != "canary" {
				t.Fatalf("canary version in pool %s", d.Pool)
			}
		}
		// Sticky: the same conversation draws the same version every time.
		if again := e.explain(q); again.Version != d.Version {
			t.Fatalf("%s: %s then %s", q.Conversation, d.Version, again.Version)
		}
	}
	if share := float64(canary) / n; share < 0.04 || share > 0.06 {
		t.Fatalf("canary share %.4f, want 0.05 ± 0.01", share)
	}

	// Without a conversation the draw is random, at the same weight.
	canary = 0
	for range n {
		if d := e.explain(chat("chat-large")); d.Version == "v1.6.0" {
			canary++
		}
	}
	if share := float64(canary) / n; share < 0.04 || share > 0.06 {
		t.Fatalf("random canary share %.4f, want 0.05 ± 0.01", share)
	}

	// Earlier pool rules win: long-context, premium and batch never get it.
	for i := range 2000 {
		long, prem, batch := chat("chat-large"), chat("chat-large"), chat("chat-large")
		for _, q := range []*policy.Request{long, prem, batch} {
			q.Conversation = "conv-" + itoa(i)
		}
		long.PromptTokens, prem.Tenant, batch.Priority = 20000, "acme", subjects.PriorityBatch
		for _, q := range []*policy.Request{long, prem, batch} {
			if d := e.explain(q); d.Version != "v1.5.0" {
				t.Fatalf("%+v got version %s in pool %s", q, d.Version, d.Pool)
			}
		}
	}
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b [20]byte
	n := len(b)
	for ; i > 0; i /= 10 {
		n--
		b[n] = byte('0' + i%10)
	}
	return string(b[n:])
}

func TestCascadePromptRenderedOnce(t *testing.T) {
	e := newEnv(t, `{"aliases.smart": {"cascade": [
		{"when": {"features": ["code"], "regex": "x"}, "alias": "code"},
		{"when": {"regex": "never"}, "alias": "chat-large"},
		{"when": {"regex": "hello"}, "alias": "chat-small"}]}}`)
	calls := 0
	q := chat("smart")
	q.Prompt = func() []byte { calls++; return []byte("user\nhello\n") }
	d := e.decide(q)
	mustRoute(t, d)
	if d.Model != "llama-3-8b-instruct" || calls != 1 {
		t.Fatalf("model %s after %d prompt renderings, want chat-small after 1", d.Model, calls)
	}
	// No regex rule reached: the prompt is never rendered.
	calls = 0
	q.Model = "auto"
	mustRoute(t, e.decide(q))
	if calls != 0 {
		t.Fatalf("prompt rendered %d times for a cascade without regex", calls)
	}
	// A nil Prompt never matches a regex rule.
	q.Model, q.Prompt = "smart", nil
	mustReject(t, e.decide(q), 404, subjects.CodeModelNotFound)
}

// A decider away from the bus misses heartbeats that say nothing of the
// replicas: after its reconnect their silence is counted without its
// absence, instead of the whole view looking dead at once; a replica
// already dead when it left stays dead.
func TestAReconnectKeepsTheLoadView(t *testing.T) {
	for _, reconnect := range []bool{true, false} {
		e := newEnv(t) // every replica heard at t0
		lost := t0.Add(time.Second)
		e.now = t0.Add(14 * time.Second) // away from the bus since lost, back now
		if reconnect {
			e.r.Reconnected(lost, e.now)
		}
		e.now = t0.Add(20 * time.Second) // past dead_after (15 s) since the heartbeats; 7 s of it while present
		e.beat("l70-gen-0", 0.1, 0, 0)   // another replica heard: the router is not deaf
		d := e.explain(chat("chat-small"))
		switch {
		case reconnect && d.Err != nil:
			t.Fatalf("after a 13 s absence: %v; want the replicas kept", d.Err)
		case !reconnect && d.Err == nil:
			t.Fatalf("without a reconnect the replicas silent for 20 s were kept (%s): the check cannot tell", d.Replica)
		}
	}
	t.Run("dead before the absence", func(t *testing.T) {
		e := newEnv(t)
		e.now = t0.Add(16 * time.Second)
		e.beat("l70-gen-0", 0.1, 0, 0)   // heard while the others were silent:
		lost := t0.Add(16 * time.Second) // the replicas were dead already
		e.r.Reconnected(lost, t0.Add(17*time.Second))
		e.now = t0.Add(17 * time.Second)
		if d := e.explain(chat("chat-small")); d.Err == nil {
			t.Fatalf("a replica dead before the decider left was brought back: %s", d.Replica)
		}
	})
}

// A router with evidence of its own lag (SetLagging) takes the replicas'
// silence since it last heard any of them as its own, and keeps them;
// without that evidence, a fleet silent past dead_after is gone (a whole
// fleet can die at once), and so is one replica silent while another is
// heard.
func TestALaggingRouterKeepsItsReplicas(t *testing.T) {
	e := newEnv(t) // every replica heard at t0
	e.now = t0.Add(30 * time.Second)
	mustReject(t, e.explain(chat("qwen-coder-32b")), 503, subjects.CodeNoReplicas)
	e.r.SetLagging(true)
	mustRoute(t, e.explain(chat("qwen-coder-32b")))
	if got := e.r.Deafness(e.now); got != 30*time.Second {
		t.Errorf("Deafness = %v, want 30s (heard from no replica since t0)", got)
	}
	if !e.r.HeardSince("coder-gen-0", e.now.Add(-2*time.Second), e.now) {
		t.Error("HeardSince: a replica heard with the last of them is not recent to a lagging router")
	}
	e.beat("pd-decode-0", 0.1, 0, 0) // heard again: the silent ones are dead
	if got := e.r.Deafness(e.now); got != 0 {
		t.Errorf("Deafness = %v after a heartbeat, want 0", got)
	}
	mustReject(t, e.explain(chat("qwen-coder-32b")), 503, subjects.CodeNoReplicas)
}
