package policy_test

import (
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/subjects"
)

// model_loading's Retry-After is the time the load has left, as the
// loader's statuses tell it, not a constant.
func TestColdRetryAfterFollowsTheLoad(t *testing.T) {
	const model = "mixtral-8x22b"
	retry := func(e *env) time.Duration {
		t.Helper()
		d := e.decide(chat("mixtral"))
		if d.Err == nil || d.Err.Code != subjects.CodeModelLoading {
			t.Fatalf("decision = %+v, want model_loading", d.Err)
		}
		if got := d.Err.Headers[subjects.HdrRouteModel]; got != model {
			t.Fatalf("rejection names model %q, want %q", got, model)
		}
		return d.Err.RetryAfter
	}
	tests := []struct {
		name     string
		extra    string
		statuses []subjects.LoadStatus
		want     time.Duration
	}{
		{name: "nothing known", want: policy.RetryColdLoad},
		{
			name:  "the table's expected_load_seconds",
			extra: `{"models.mixtral-8x22b": {"versions": ["v1.0.0"], "tier": "cold", "expected_load_seconds": 90}}`,
			want:  90 * time.Second,
		},
		{
			name: "the expected time left of the load in flight",
			statuses: []subjects.LoadStatus{{Model: model, Phase: subjects.LoadRequested,
				StartedUnixMillis: t0.Add(-8 * time.Second).UnixMilli(), ExpectedMillis: 20_000}},
			want: 12 * time.Second,
		},
		{
			name: "the last measured time to ready",
			statuses: []subjects.LoadStatus{
				{Model: model, Phase: subjects.LoadReady, StartedUnixMillis: t0.Add(-time.Hour).UnixMilli(), ElapsedMillis: 42_000},
				{Model: model, Phase: subjects.LoadUnloaded},
			},
			want: 42 * time.Second,
		},
		{
			name:     "a failed load's cooldown",
			statuses: []subjects.LoadStatus{{Model: model, Phase: subjects.LoadFailed, RetryAfterMillis: 30_000, Error: "no GPU"}},
			want:     30 * time.Second,
		},
		{
			name: "a start in the far future cannot lie a Retry-After into absurdity",
			statuses: []subjects.LoadStatus{{Model: model, Phase: subjects.LoadStarted,
				StartedUnixMillis: t0.Add(100 * 365 * 24 * time.Hour).UnixMilli(), ExpectedMillis: 1 << 60}},
			want: time.Hour,
		},
		{
			name:     "nor an absurd cooldown",
			statuses: []subjects.LoadStatus{{Model: model, Phase: subjects.LoadFailed, RetryAfterMillis: 1 << 60}},
			want:     time.Hour,
		},
		{
			name: "an overdue load is retried soon, not never",
			statuses: []subjects.LoadStatus{{Model: model, Phase: subjects.LoadStarted,
				StartedUnixMillis: t0.Add(-time.Minute).UnixMilli(), ExpectedMillis: 20_000}},
			want: policy.RetryColdOverdue,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var e *env
			if tt.extra != "" {
				e = newEnv(t, tt.extra)
			} else {
				e = newEnv(t)
			}
			for i := range tt.statuses {
				e.r.ObserveLoad(&tt.statuses[i], t0)
			}
			if got := retry(e); got != tt.want {
				t.Errorf("Retry-After = %s, want %s", got, tt.want)
			}
		})
	}
}

// A request held at the gateway counts once against the tenant's request
// quota: when it is held, not again when it is admitted after the wait.
func TestHeldRequestCountsOnceAgainstTheQuota(t *testing.T) {
	e := newEnv(t, `{"models.mixtral-8x22b": {"versions": ["v1.0.0"], "tier": "cold", "on_cold": "wait"},
		"tenants.trial": {"tier": "standard", "quota": {"rpm": 2}}}`)
	q := chat("mixtral")
	q.Tenant = "trial"
	if d := e.decide(q); d.Err == nil || d.Err.Code != subjects.CodeModelLoading {
		t.Fatalf("first = %+v, want model_loading", d.Err)
	}
	// The held request, retried after the wait, is not charged again (the
	// model is still loading: it gets model_loading without a 429).
	held := chat("mixtral")
	held.Tenant, held.ColdWaited = "trial", true
	for range 3 {
		if d := e.decide(held); d.Err == nil || d.Err.Code != subjects.CodeModelLoading {
			t.Fatalf("held retry = %+v, want model_loading", d.Err)
		}
	}
	// One more new request fits the rpm of 2; the third does not.
	if d := e.decide(q); d.Err == nil || d.Err.Code != subjects.CodeModelLoading {
		t.Fatalf("second = %+v, want model_loading", d.Err)
	}
	if d := e.decide(q); d.Err == nil || d.Err.Code != subjects.CodeRateLimit {
		t.Fatalf("third = %+v, want rate_limit_exceeded: held requests count against the quota", d.Err)
	}
}
