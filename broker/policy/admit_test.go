package policy_test

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/subjects"
)

// TestRejections checks, one rule per case, each rejection with its status,
// code and retry hint.
func TestRejections(t *testing.T) {
	full := func(e *env, ids ...string) {
		for _, id := range ids {
			e.beat(id, 0.99, 32, 128, func(h *subjects.Heartbeat) { h.QueueWaitMillis = 4000 })
		}
	}
	tests := []struct {
		name   string
		extra  string
		setup  func(e *env)
		req    func() *policy.Request
		status int
		code   string
		retry  time.Duration // 0: none expected
		check  func(t *testing.T, d *policy.Decision)
	}{
		{
			name:   "prompt over the model's context",
			req:    func() *policy.Request { q := chat("code"); q.PromptTokens = 40000; return q },
			status: 400, code: subjects.CodeContextLength,
		},
		{
			name:   "prompt and completion over the model's context",
			req:    func() *policy.Request { q := chat("code"); q.PromptTokens, q.MaxTokens = 30000, 4000; return q },
			status: 400, code: subjects.CodeContextLength,
			check: func(t *testing.T, d *policy.Decision) {
				want := "This model's maximum context length is 32768 tokens. However, you requested 34000 tokens (30000 in the messages, 4000 in the completion)."
				if !strings.HasPrefix(d.Err.Message, want) || d.Err.Param != "messages" {
					t.Fatalf("message %q param %q", d.Err.Message, d.Err.Param)
				}
			},
		},
		{
			name:   "tenant restricted",
			req:    func() *policy.Request { q := chat("chat-large"); q.Tenant = "intern"; return q },
			status: 403, code: subjects.CodeModelNotAllowed,
		},
		{
			name:   "restricted tenant through a cascade to a model it may not use",
			req:    func() *policy.Request { q := chat("auto"); q.Tenant = "intern"; q.PromptTokens = 5000; return q },
			status: 403, code: subjects.CodeModelNotAllowed,
		},
		{
			name:   "explicit adapter the tenant does not own",
			req:    func() *policy.Request { q := chat("chat-small:team-x-v3"); q.Tenant = "acme"; return q },
			status: 403, code: subjects.CodeModelNotAllowed,
		},
		{
			name:   "explicit adapter not listed in that exact form",
			extra:  `{"tenants.lab": {"allowed_models": ["chat-small"]}}`,
			req:    func() *policy.Request { q := chat("chat-small:exp-1"); q.Tenant = "lab"; return q },
			status: 403, code: subjects.CodeModelNotAllowed,
		},
		{
			name:   "unknown model",
			req:    func() *policy.Request { return chat("gpt-17") },
			status: 404, code: subjects.CodeModelNotFound,
		},
		{
			name:   "alias naming an unknown model",
			extra:  `{"aliases.broken": {"targets": [{"model": "nowhere", "weight": 1}]}}`,
			req:    func() *policy.Request { return chat("broken") },
			status: 503, code: subjects.CodeNoReplicas, retry: policy.RetryNoReplicas,
		},
		{
			name:   "cascade loop",
			extra:  `{"aliases.x": {"cascade": [{"when": {}, "alias": "y"}]}, "aliases.y": {"cascade": [{"when": {}, "alias": "x"}]}}`,
			req:    func() *policy.Request { return chat("x") },
			status: 404, code: subjects.CodeModelNotFound,
		},
		{
			name:   "no cascade rule matches",
			extra:  `{"aliases.picky": {"cascade": [{"when": {"features": ["code"]}, "alias": "code"}]}}`,
			req:    func() *policy.Request { return chat("picky") },
			status: 404, code: subjects.CodeModelNotFound,
		},
		{
			name:   "empty model",
			req:    func() *policy.Request { return chat("") },
			status: 400, code: subjects.CodeInvalidRequest,
		},
		{
			name:   "empty adapter name",
			req:    func() *policy.Request { q := chat("chat-small:"); q.Tenant = "team-x"; return q },
			status: 400, code: subjects.CodeInvalidRequest,
		},
		{
			name:   "every candidate at capacity",
			setup:  func(e *env) { full(e, "l8-gen-0", "l8-gen-1") },
			req:    func() *policy.Request { return chat("chat-small") },
			status: 503, code: subjects.CodeAllReplicasBusy, retry: 4 * time.Second,
		},
		{
			name:   "estimated wait beyond the deadline",
			setup:  func(e *env) { slow(e, "l8-gen-0", 3000); slow(e, "l8-gen-1", 2000) },
			req:    func() *policy.Request { q := chat("chat-small"); q.Deadline = t0.Add(500 * time.Millisecond); return q },
			status: 503, code: subjects.CodeDeadlineUnmeetable, retry: 1500 * time.Millisecond,
		},
		{
			name:   "deadline already passed",
			req:    func() *policy.Request { q := chat("chat-small"); q.Deadline = t0.Add(-time.Second); return q },
			status: 503, code: subjects.CodeDeadlineUnmeetable, retry: policy.RetryDeadlineMin,
		},
		{
			name:   "cold model with no replica asks for a load",
			req:    func() *policy.Request { return chat("mixtral") },
			status: 503, code: subjects.CodeModelLoading, retry: policy.RetryColdLoad,
			check: func(t *testing.T, d *policy.Decision) {
				if !d.ControlLoad || d.LoadModel != "mixtral-8x22b" || d.LoadVersion != "v1.0.0" || d.Model != "mixtral-8x22b" {
					t.Fatalf("control load %v %q %q, model %q", d.ControlLoad, d.LoadModel, d.LoadVersion, d.Model)
				}
			},
		},
		{
			name: "hot model whose replica is loading",
			setup: func(e *env) {
				e.beat("coder-gen-0", 0, 0, 0, func(h *subjects.Heartbeat) { h.State = subjects.StateLoading })
			},
			req:    func() *policy.Request { return chat("qwen-coder-32b") },
			status: 503, code: subjects.CodeModelLoading, retry: policy.RetryWarming,
			check: func(t *testing.T, d *policy.Decision) {
				if d.ControlLoad {
					t.Fatal("a hot model asked for a load")
				}
			},
		},
		{
			name: "hot model with no replica",
			// Its replicas silent a minute while another is heard: dead,
			// not the router's own deafness.
			setup:  func(e *env) { e.now = e.now.Add(time.Minute); e.beat("pd-decode-0", 0.1, 0, 0) },
			req:    func() *policy.Request { return chat("code") },
			status: 503, code: subjects.CodeNoReplicas, retry: policy.RetryNoReplicas,
		},
		{
			name:   "explicit adapter never falls back",
			setup:  func(e *env) { e.now = e.now.Add(time.Minute); e.beat("pd-decode-0", 0.1, 0, 0) },
			req:    func() *policy.Request { q := chat("chat-small:team-x-v3"); q.Tenant = "team-x"; return q },
			status: 503, code: subjects.CodeNoReplicas, retry: policy.RetryNoReplicas,
		},
		{
			name: "fallback loop without a replica ends",
			extra: `{
				"aliases.a": {"targets": [{"model": "ghost", "weight": 1}], "fallbacks": ["b"]},
				"aliases.b": {"targets": [{"model": "ghost", "weight": 1}], "fallbacks": ["a"]},
				"models.ghost": {}}`,
			req:    func() *policy.Request { return chat("a") },
			status: 503, code: subjects.CodeNoReplicas, retry: policy.RetryNoReplicas,
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
			d := e.decide(tc.req())
			mustReject(t, d, tc.status, tc.code)
			if d.Err.RetryAfter != tc.retry {
				t.Fatalf("RetryAfter %v, want %v", d.Err.RetryAfter, tc.retry)
			}
			if tc.retry > 0 && len(d.Err.RetryAfterHeaders()) != 2 {
				t.Fatal("no Retry-After headers")
			}
			if d.Err.Message == "" {
				t.Fatal("empty message")
			}
			if tc.check != nil {
				tc.check(t, d)
			}
		})
	}
}

func slow(e *env, id string, ttft float64) {
	e.beat(id, 0.1, 0, 0, func(h *subjects.Heartbeat) { h.TTFTEWMAMillis = ttft })
}

func TestNoTable(t *testing.T) {
	r := policy.New(policy.Config{})
	d := r.Decide(chat("chat-small"), t0, rand.New(rand.NewPCG(1, 1)))
	mustReject(t, &d, 503, subjects.CodeRouterUnavailable)
	if d.Err.RetryAfter != policy.RetryNoTable {
		t.Fatalf("RetryAfter %v", d.Err.RetryAfter)
	}
	e := newEnv(t)
	mustRoute(t, e.decide(chat("chat-small")))
	e.r.SetTable(nil)
	mustReject(t, e.decide(chat("chat-small")), 503, subjects.CodeRouterUnavailable)
}

func TestDeadlineSwitchesToTheFastestReplica(t *testing.T) {
	e := newEnv(t)
	conv := convOn(t, e, "l8-gen-0")
	slow(e, "l8-gen-0", 3000)
	slow(e, "l8-gen-1", 200)
	q := chat("chat-small")
	q.Conversation, q.Deadline = conv, t0.Add(time.Second)
	d := e.decide(q)
	mustRoute(t, d)
	if d.Replica != "l8-gen-1" || d.Reason != policy.ReasonSession+"+"+policy.ReasonDeadline {
		t.Fatalf("%s (%s), want l8-gen-1 for the deadline", d.Replica, d.Reason)
	}
	if a := d.Alternatives(); len(a) != 1 || a[0].Why != policy.WhyDeadline {
		t.Fatalf("alternatives %+v", a)
	}
}

func TestColdModelFallsBackAndStillLoads(t *testing.T) {
	e := newEnv(t, `{"aliases.mixtral": {"targets": [{"model": "mixtral-8x22b", "version": "v1.0.0", "weight": 100}], "fallbacks": ["chat-small"]}}`)
	d := e.decide(chat("mixtral"))
	mustRoute(t, d)
	if !d.ControlLoad || d.LoadModel != "mixtral-8x22b" || d.Model != "llama-3-8b-instruct" {
		t.Fatalf("control load %v %q, model %q", d.ControlLoad, d.LoadModel, d.Model)
	}
	if d.Reason[:len(policy.ReasonFallback)] != policy.ReasonFallback {
		t.Fatalf("reason %s", d.Reason)
	}
}

func TestQuota(t *testing.T) {
	t.Run("rpm with headers", func(t *testing.T) {
		e := newEnv(t)
		q := chat("chat-small")
		q.Tenant = "trial" // rpm 5
		for i := range 5 {
			mustRoute(t, e.decide(q))
			_ = i
		}
		d := e.decide(q)
		mustReject(t, d, 429, subjects.CodeRateLimit)
		// Empty bucket: one request refills in 60/5 = 12 s.
		if d.Err.RetryAfter != 12*time.Second {
			t.Fatalf("RetryAfter %v, want 12s", d.Err.RetryAfter)
		}
		h := d.Err.Headers
		if h[subjects.HdrRateLimitLimitRequests] != "5" || h[subjects.HdrRateLimitRemainingRequests] != "0" ||
			h[subjects.HdrRateLimitResetRequests] != "1m0s" {
			t.Fatalf("headers %v", h)
		}
		if _, ok := h[subjects.HdrRateLimitLimitTokens]; ok {
			t.Fatal("token headers without a tpm limit")
		}
		e.now = e.now.Add(12 * time.Second)
		mustRoute(t, e.decide(q))
	})
	t.Run("share with 2 live brokers", func(t *testing.T) {
		e := newEnv(t)
		e.r.SetLiveBrokers(2)
		q := chat("chat-small")
		q.Tenant = "trial" // 5 / 2 = 2.5 per broker
		mustRoute(t, e.decide(q))
		mustRoute(t, e.decide(q))
		d := e.decide(q)
		mustReject(t, d, 429, subjects.CodeRateLimit)
		if got := d.Err.Headers[subjects.HdrRateLimitRemainingRequests]; got != "1" {
			t.Fatalf("remaining %s, want 1 (0.5 left here × 2 brokers)", got)
		}
	})
	t.Run("explain does not charge", func(t *testing.T) {
		e := newEnv(t)
		q := chat("chat-small")
		q.Tenant = "trial"
		for range 20 {
			mustRoute(t, e.explain(q))
		}
		mustRoute(t, e.decide(q))
	})
	t.Run("usage settles the tpm reservation", func(t *testing.T) {
		e := newEnv(t, `{"tenants.metered": {"quota": {"tpm": 1000}}}`)
		q := chat("chat-small")
		q.Tenant, q.PromptTokens, q.MaxTokens = "metered", 100, 400
		q.ID = "req-1"
		d := e.decide(q)
		mustRoute(t, d)
		if d.ReservedTokens != 500 {
			t.Fatalf("reserved %d, want 500", d.ReservedTokens)
		}
		q.ID = "req-2"
		mustRoute(t, e.decide(q))
		q.ID = "req-3"
		d = e.decide(q)
		mustReject(t, d, 429, subjects.CodeRateLimit)
		if d.Err.Headers[subjects.HdrRateLimitLimitTokens] != "1000" || d.Err.Headers[subjects.HdrRateLimitRemainingTokens] != "0" {
			t.Fatalf("headers %v", d.Err.Headers)
		}
		// Usage for a request this broker holds no reservation for (another
		// broker's, or a forgery) settles nothing, whatever it claims.
		if e.r.ObserveUsage(&subjects.Usage{Tenant: "metered", RequestID: "someone-else", ReservedTokens: 1e9}, e.now) {
			t.Fatal("usage for an unknown request id settled")
		}
		mustReject(t, e.decide(q), 429, subjects.CodeRateLimit)
		// Ours: 500 reserved, 120 used, 380 back; then 500 needs 120 more.
		// The event's tenant and reserved count are not believed.
		if !e.r.ObserveUsage(&subjects.Usage{Tenant: "other", RequestID: "req-1", ReservedTokens: 1e9, PromptTokens: 100, CompletionTokens: 20}, e.now) {
			t.Fatal("our reservation not settled")
		}
		// At most once.
		if e.r.ObserveUsage(&subjects.Usage{Tenant: "metered", RequestID: "req-1", ReservedTokens: 500}, e.now) {
			t.Fatal("a reservation settled twice")
		}
		d = e.decide(q)
		mustReject(t, d, 429, subjects.CodeRateLimit)
		if d.Err.RetryAfter != 7200*time.Millisecond { // 120 tokens at 1000/min
			t.Fatalf("RetryAfter %v, want 7.2s", d.Err.RetryAfter)
		}
		q.MaxTokens = 200 // 300 now fits in the 380 returned
		mustRoute(t, e.decide(q))
	})
	t.Run("usage of a tenant without a token quota is not refused", func(t *testing.T) {
		e := newEnv(t, `{"tenants.metered": {"quota": {"tpm": 1000}}, "tenants.free": {}}`)
		q := chat("chat-small")
		q.Tenant, q.PromptTokens, q.MaxTokens, q.ID = "free", 100, 400, "req-f"
		if d := e.decide(q); d.Err != nil || d.ReservedTokens != 500 {
			t.Fatalf("free request: %v, %d reserved", d.Err, d.ReservedTokens)
		}
		if n := e.r.Reservations(); n != 0 {
			t.Fatalf("%d reservations held for a tenant without a token quota", n)
		}
		// Its usage had nothing to settle: believed, and nothing changes.
		for _, tenant := range []string{"free", "not-in-the-table"} {
			if !e.r.ObserveUsage(&subjects.Usage{Tenant: tenant, RequestID: "req-f", CompletionTokens: 20}, e.now) {
				t.Fatalf("usage of unmetered tenant %q refused", tenant)
			}
		}
		// A metered tenant's usage without a reservation still is.
		if e.r.ObserveUsage(&subjects.Usage{Tenant: "metered", RequestID: "req-f", CompletionTokens: 20}, e.now) {
			t.Fatal("usage of a metered tenant without a reservation believed")
		}
	})
	t.Run("a continuation is not admitted again", func(t *testing.T) {
		e := newEnv(t, `{"tenants.metered": {"quota": {"tpm": 1000}}}`)
		q := chat("chat-small")
		q.Tenant, q.PromptTokens, q.MaxTokens = "metered", 100, 400
		mustRoute(t, e.decide(q))
		mustRoute(t, e.decide(q))
		mustReject(t, e.decide(q), 429, subjects.CodeRateLimit)
		// Its request was charged: the continuation is never refused,
		// however often it comes.
		c := *q
		c.ResumeFrom, c.ResumeTokens = "l8-gen-0", 100
		for range 3 {
			if d := e.decide(&c); d.Err != nil || d.Replica == "" {
				t.Fatalf("continuation refused: %v", d.Err)
			}
		}
	})
	t.Run("a continuation's generated tokens are charged once", func(t *testing.T) {
		e := newEnv(t, `{"tenants.metered": {"quota": {"tpm": 1000}}}`)
		q := chat("chat-small")
		q.Tenant, q.PromptTokens, q.MaxTokens, q.ID = "metered", 100, 400, "req-a"
		mustRoute(t, e.decide(q)) // 500 reserved, 500 left
		c := *q
		c.ID, c.ResumeFrom, c.ResumeTokens, c.MaxTokens = "req-c", "l8-gen-0", 100, 300
		mustRoute(t, e.decide(&c)) // 300 more reserved, 200 left
		// The continuation generated 50: 250 come back. Its prompt (the
		// original prompt and the carried text) was charged with the first
		// part and does not count again.
		if !e.r.ObserveUsage(&subjects.Usage{RequestID: "req-c", PromptTokens: 5000, CompletionTokens: 50}, e.now) {
			t.Fatal("the continuation's reservation was not settled")
		}
		q2 := *q
		q2.ID = "req-b"
		d := e.decide(&q2) // 500 wanted, 450 left
		mustReject(t, d, 429, subjects.CodeRateLimit)
		if d.Err.RetryAfter != 3*time.Second { // 50 tokens at 1000/min
			t.Fatalf("RetryAfter %v, want 3s: the continuation's 50 tokens charged once", d.Err.RetryAfter)
		}
	})
	t.Run("default max tokens are reserved", func(t *testing.T) {
		e := newEnv(t)
		q := chat("chat-small")
		if d := e.decide(q); d.ReservedTokens != 100+1024 {
			t.Fatalf("reserved %d, want prompt + default_max_tokens", d.ReservedTokens)
		}
	})
}

func TestWire(t *testing.T) {
	e := newEnv(t)
	q := chat("chat-small")
	q.Tenant, q.PromptTokens = "default", 77
	d := e.decide(q)
	w := d.Wire(q)
	if w.Status != 200 || w.Tenant != "default" || w.Requested != "chat-small" || w.Model != d.Model ||
		w.Replica != d.Replica || w.PromptTokens != 77 || w.TableRevision != 42 || len(w.Alternatives) != d.NAlts {
		t.Fatalf("wire %+v", w)
	}
	d = e.decide(chat("nope"))
	if w := d.Wire(q); w.Status != 404 || w.Code != subjects.CodeModelNotFound || w.Message == "" {
		t.Fatalf("wire %+v", w)
	}
}

func TestClockMeasuresDuration(t *testing.T) {
	ticks := 0
	clock := func() time.Time { ticks++; return t0.Add(time.Duration(ticks) * time.Microsecond) }
	r := policy.New(policy.Config{Clock: clock})
	d := r.Decide(chat("x"), t0, nil)
	if d.Duration != time.Microsecond {
		t.Fatalf("duration %v", d.Duration)
	}
}

func TestConcurrentUse(t *testing.T) {
	e := newEnv(t)
	done := make(chan struct{})
	for g := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			for i := range 500 {
				q := chat("chat-large")
				q.Conversation = strconv.Itoa(i)
				e.r.Decide(q, t0, rng)
				if i%50 == 0 {
					e.r.ObserveHeartbeat(&subjects.Heartbeat{Replica: "l70-gen-0", State: subjects.StateReady}, t0)
					e.r.ObservePlacement(&subjects.Placement{Model: "llama-3-70b-instruct", Replica: "l70-gen-1", Blocks: []uint64{1, 2}})
					e.r.SetTable(e.r.Table())
				}
			}
		}()
	}
	for range 4 {
		<-done
	}
}

// TestOwnInFlightNeverRejects: between two heartbeats a broker may send a
// replica far more requests than its batch and queue hold (they are short
// and finish); only the replica's reported state can make it "busy".
func TestOwnInFlightNeverRejects(t *testing.T) {
	e := newEnv(t)
	for i := range 1000 {
		d := e.decide(chat("code"))
		if d.Err != nil {
			t.Fatalf("request %d since the heartbeat rejected: %v", i, d.Err)
		}
	}
	// The reported state still can: a full queue and a full batch.
	e.beat("coder-gen-0", 0.5, 32, 128)
	mustReject(t, e.decide(chat("code")), 503, "all_replicas_busy")
}

// TestLateHeartbeatIsStaleButAlive: load data is dated by the older of
// receipt and sent_unix_ms, liveness by receipt alone.
func TestLateHeartbeatIsStaleButAlive(t *testing.T) {
	e := newEnv(t)
	for _, id := range []string{"l8-gen-0", "l8-gen-1"} {
		e.beat(id, 0.1, 0, 0, func(hb *subjects.Heartbeat) { hb.SentUnixMillis = e.now.Add(-30 * time.Second).UnixMilli() })
	}
	d := e.decide(chat("chat-small"))
	mustRoute(t, d)
	if !strings.Contains(d.Reason, "stale-random") {
		t.Errorf("reason %q: load data sent 30 s ago must count as stale", d.Reason)
	}
	// An adapter clock an hour behind makes the data stale, never the replica dead.
	for _, id := range []string{"l8-gen-0", "l8-gen-1"} {
		e.beat(id, 0.1, 0, 0, func(hb *subjects.Heartbeat) { hb.SentUnixMillis = e.now.Add(-time.Hour).UnixMilli() })
	}
	mustRoute(t, e.decide(chat("chat-small")))
	// A fresh one is fresh again.
	for _, id := range []string{"l8-gen-0", "l8-gen-1"} {
		e.beat(id, 0.1, 0, 0, func(hb *subjects.Heartbeat) { hb.SentUnixMillis = e.now.UnixMilli() })
	}
	if d := e.decide(chat("chat-small")); strings.Contains(d.Reason, "stale") {
		t.Errorf("fresh heartbeat, reason %q", d.Reason)
	}
}

func TestPromptAndCompletionThatFitAreAdmitted(t *testing.T) {
	e := newEnv(t)
	q := chat("code")
	q.PromptTokens, q.MaxTokens = 30000, 2768
	mustRoute(t, e.decide(q))
}
