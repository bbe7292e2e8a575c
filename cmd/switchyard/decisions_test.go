package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/auth"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/subjects"
)

func decisionAt(ms int64) subjects.Decision {
	return subjects.Decision{
		Tenant: "default", Requested: "chat-large", Model: "llama-3-70b-instruct", Version: "v1.5.0",
		Pool: "general", Replica: "l70-gen-1", Reason: "power-of-two", Score: 0.118,
		Alternatives:   []subjects.Alternative{{Replica: "l70-gen-0", Score: 0.412, Why: "higher load_score"}},
		Status:         200,
		DecidedUnixMil: ms,
	}
}

func TestFormatDecision(t *testing.T) {
	at := time.Date(2025, 3, 4, 14, 3, 7, 412e6, time.UTC).UnixMilli()
	lora := decisionAt(at)
	lora.Tenant, lora.Requested, lora.Model, lora.Version, lora.Lora = "team-x", "chat-small", "llama-3-8b-instruct", "v1.0.0", "team-x-v3"
	lora.Replica, lora.Reason, lora.Alternatives = "l8-gen-0", "lora-affinity", nil
	resumed := lora
	resumed.Replica, resumed.ResumeFrom, resumed.ResumeTokens = "l8-gen-1", "l8-gen-0", 100
	split := decisionAt(at)
	split.Requested, split.Model, split.Version, split.Replica, split.Alternatives = "pd-model", "pd-model", "v1", "pd-d0", nil
	split.PrefillReplica, split.Split, split.UncachedTokens = "pd-p1", "split", 6000
	whole := split
	whole.PrefillReplica, whole.Split, whole.UncachedTokens = "", "whole: below min_uncached_tokens", 900
	rejected := subjects.Decision{
		Tenant: "trial", Requested: "chat-large", Status: 429, Code: "rate_limit_exceeded",
		Message: "rpm quota of 5 reached", Reason: "", DecidedUnixMil: at,
	}
	for _, tc := range []struct {
		name string
		d    subjects.Decision
		want string
	}{
		{"routed with a runner-up", decisionAt(at),
			"14:03:07.412 default  chat-large → llama-3-70b-instruct v1.5.0  pool general  → l70-gen-1  power-of-two  runner-up l70-gen-0 (0.412 vs 0.118): higher load_score"},
		{"LoRA, no runner-up", lora,
			"14:03:07.412 team-x   chat-small → llama-3-8b-instruct v1.0.0 +lora team-x-v3  pool general  → l8-gen-0  lora-affinity  no runner-up"},
		{"a continuation", resumed,
			"14:03:07.412 team-x   chat-small → llama-3-8b-instruct v1.0.0 +lora team-x-v3  pool general  → l8-gen-1  lora-affinity  resumed from l8-gen-0, 100 tokens carried  no runner-up"},
		{"split", split,
			"14:03:07.412 default  pd-model → pd-model v1  pool general  → pd-d0  power-of-two  prefill on pd-p1 (6000 uncached tokens)  no runner-up"},
		{"served whole", whole,
			"14:03:07.412 default  pd-model → pd-model v1  pool general  → pd-d0  power-of-two  whole: below min_uncached_tokens (900 uncached tokens)  no runner-up"},
		{"rejected before a model", rejected,
			"14:03:07.412 trial    chat-large  rejected 429 rate_limit_exceeded: rpm quota of 5 reached"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := formatDecision(&tc.d, time.UTC); got != tc.want {
				t.Errorf("formatDecision\n got: %s\nwant: %s", got, tc.want)
			}
		})
	}
}

func TestDecisionFilter(t *testing.T) {
	d := decisionAt(0)
	d.Requested = "chat-large:team-x-v3"
	for _, tc := range []struct {
		f    decisionFilter
		want bool
	}{
		{decisionFilter{}, true},
		{decisionFilter{pool: "general"}, true},
		{decisionFilter{pool: "canary"}, false},
		{decisionFilter{model: "chat-large"}, true},
		{decisionFilter{model: "chat-large:team-x-v3"}, true},
		{decisionFilter{model: "llama-3-70b-instruct"}, true},
		{decisionFilter{model: "chat-small"}, false},
		{decisionFilter{replica: "l70-gen-1"}, true},
		{decisionFilter{replica: "l70-gen-0"}, false},
		{decisionFilter{pool: "general", model: "chat-large", replica: "l70-gen-0"}, false},
	} {
		if got := tc.f.match(&d); got != tc.want {
			t.Errorf("%+v.match = %v, want %v", tc.f, got, tc.want)
		}
	}
}

// TestDecisionsFollowsAndFilters runs `switchyard decisions` as the
// observer identity against a server under Switchyard's authorization, and
// without credentials against one that allows anonymous clients.
func TestDecisionsFollowsAndFilters(t *testing.T) {
	t.Run("as the observer", func(t *testing.T) {
		sec := natstest.StartSecured(t, auth.Config{})
		broker := sec.Connect(t, auth.Role{Kind: auth.RoleBroker})
		followDecisions(t, broker, "--nats", sec.URL, "--creds", sec.Creds(t, auth.Role{Kind: auth.RoleObserver}))
	})
	t.Run("anonymous", func(t *testing.T) {
		_, url := natstest.Start(t)
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		followDecisions(t, nc, "--nats", url)
	})
}

// followDecisions runs the command with connect flags while nc publishes
// decisions, and checks that it prints only the matching one.
func followDecisions(t *testing.T, nc *nats.Conn, connect ...string) {
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut testkit.SyncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, append([]string{"decisions", "--model", "chat-large", "--replica", "l70-gen-1"}, connect...), &out, &errOut)
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("exit code %d, stderr %q", code, errOut.String())
		}
	}()
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, testkit.Cond("the decisions", func() bool { return strings.Contains(errOut.String(), "following llm.decision.>") }))

	publish := func(d subjects.Decision) {
		b, _ := json.Marshal(d)
		if err := nc.Publish(subjects.New("").Decision(d.Pool), b); err != nil {
			t.Fatal(err)
		}
	}
	other := decisionAt(time.Now().UnixMilli())
	other.Replica = "l70-gen-0"
	publish(other)
	want := decisionAt(time.Now().UnixMilli())
	want.RequestID = "wanted"
	publish(want)
	line := formatDecision(&want, time.Local)
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, testkit.Cond("the decisions", func() bool { return strings.Contains(out.String(), line) }))
	if n := strings.Count(out.String(), "\n"); n != 1 {
		t.Errorf("printed %d lines, want only the matching one:\n%s", n, out.String())
	}
}

func TestDecisionsRejectsABadPool(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"decisions", "--pool", "a.b"}, &out, &errOut); code != exitUsage {
		t.Errorf("exit code %d, want %d (stderr %q)", code, exitUsage, errOut.String())
	}
}

func TestExplainShowsTheSplit(t *testing.T) {
	d := decisionAt(0)
	d.Requested, d.Model, d.Replica = "llama-3-70b-pd", "llama-3-70b-pd", "pd-decode-1"
	d.PrefillReplica, d.Split, d.UncachedTokens = "pd-prefill-0", "split", 6000
	var b strings.Builder
	printDecision(&b, &d)
	if !strings.Contains(b.String(), "prefill   pd-prefill-0, decode on pd-decode-1 (split: 6000 uncached tokens)") {
		t.Errorf("split explained as:\n%s", b.String())
	}
	d.PrefillReplica, d.Split, d.UncachedTokens = "", "whole: no prefill replica", 6000
	b.Reset()
	printDecision(&b, &d)
	if !strings.Contains(b.String(), "prefill   on pd-decode-1, served whole (whole: no prefill replica; 6000 uncached tokens)") {
		t.Errorf("whole explained as:\n%s", b.String())
	}
}

func TestExplainShowsPredictedTTFT(t *testing.T) {
	d := decisionAt(0)
	d.Replica, d.PredictedTTFTMillis, d.TTFTObjectiveMillis = "l8-gen-1", 450.2, 1000
	d.Alternatives = []subjects.Alternative{{Replica: "l8-gen-0", Score: 0.1, Why: "higher predicted TTFT", PredictedTTFTMillis: 10450}}
	var b strings.Builder
	printDecision(&b, &d)
	for _, want := range []string{"ttft      predicted 450ms, objective 1s", "lost    l8-gen-0 (score 0.100, predicted TTFT 10.45s): higher predicted TTFT"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no %q in:\n%s", want, b.String())
		}
	}
}

// A replica without TTFT evidence has no prediction of its own; a prefix
// matched from placements because the replica's KV-event feed is failing
// says so.
func TestExplainShowsMissingEvidence(t *testing.T) {
	d := decisionAt(0)
	d.Replica, d.NoTTFTEvidence, d.TTFTObjectiveMillis = "l8-gen-1", true, 1
	d.Alternatives = []subjects.Alternative{{Replica: "l8-gen-0", Score: 0.4, Why: "higher load_score", NoTTFTEvidence: true}}
	d.PrefixBlocks, d.PrefixMatched, d.PrefixSource, d.KVFeedRefused = 4, 2, "placements", "token_id"
	var b strings.Builder
	printDecision(&b, &d)
	for _, want := range []string{
		"ttft      no TTFT evidence yet, objective 1ms",
		"prefix    2 of 4 blocks matched (placements); not from the engine's own events: l8-gen-1's KV-event feed is failing (its engine's messages refused: token_id)",
		"lost    l8-gen-0 (score 0.400, no TTFT evidence yet): higher load_score",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no %q in:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "predicted") {
		t.Errorf("a prediction shown without evidence:\n%s", b.String())
	}
}

func TestExplainShowsTheShares(t *testing.T) {
	d := decisionAt(0)
	d.Status, d.Code, d.Message = 429, subjects.CodeFairShareExceeded, "Pool general is shedding load"
	d.Shares = []subjects.TenantShare{
		{Tenant: "intern", Tokens: 6000, Share: 0.75, Weight: 1, FairShare: 0.5},
		{Tenant: "acme", Tokens: 2000, Share: 0.25, Weight: 1, FairShare: 0.5},
	}
	var b strings.Builder
	printDecision(&b, &d)
	for _, want := range []string{"rejected 429 fair_share_exceeded", "shares    the pool sheds; of its tokens in flight:",
		"tenant  intern 6000 tokens, 75% (weight 1, fair share 50%)", "tenant  acme 2000 tokens, 25% (weight 1, fair share 50%)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no %q in:\n%s", want, b.String())
		}
	}
}

func TestExplainShowsTheScorers(t *testing.T) {
	d := decisionAt(0)
	d.Replica, d.Score, d.Profile = "l8-gen-1", 0.42, "switchyard"
	d.Scores = []subjects.Score{{Scorer: "load_score", Weight: 1, Value: 0.42}, {Scorer: "saturated", Weight: 1, Value: 0}}
	d.Alternatives = []subjects.Alternative{{Replica: "l8-gen-0", Score: 1.3, Why: "saturated",
		Scores: []subjects.Score{{Scorer: "load_score", Weight: 1, Value: 0.3}, {Scorer: "saturated", Weight: 1, Value: 1}}}}
	var b strings.Builder
	printDecision(&b, &d)
	for _, want := range []string{"profile   switchyard: load_score 1×0.420, saturated 1×0.000",
		"lost    l8-gen-0 (score 1.300, predicted TTFT 0s): saturated\n          load_score 1×0.300, saturated 1×1.000"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no %q in:\n%s", want, b.String())
		}
	}
}

// A decision made in a region says where it was made and where its replica
// is; one that left the region says it spilled, and with what penalty
// from where.
func TestExplainShowsTheRegions(t *testing.T) {
	d := decisionAt(0)
	d.Replica, d.Reason, d.Region, d.ReplicaRegion, d.Spilled = "l8-us-0", "spill:eu->us+power-of-two", "eu", "us", true
	var b strings.Builder
	printDecision(&b, &d)
	if !strings.Contains(b.String(), "region    decided in eu, replica in us (spilled)") {
		t.Errorf("regions explained as:\n%s", b.String())
	}
	// The spill's penalty, and where it came from.
	d.SpillPenaltyMillis, d.SpillPenaltySource = 41.25, "measured"
	b.Reset()
	printDecision(&b, &d)
	if !strings.Contains(b.String(), "region    decided in eu, replica in us (spilled; penalty 41.3ms, measured)") {
		t.Errorf("a spill's penalty explained as:\n%s", b.String())
	}
	d = decisionAt(0)
	b.Reset()
	printDecision(&b, &d)
	if strings.Contains(b.String(), "region") {
		t.Errorf("a decision without regions explained as:\n%s", b.String())
	}
}
