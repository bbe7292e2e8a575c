package test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/features"
	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// post sends a chat request with the API key (none if "") and returns the
// status and response headers.
func post(t *testing.T, url, key, body string) (int, http.Header) {
	t.Helper()
	status, h, _ := chatOnce(t, url, body, bearer(key))
	return status, h
}

// bearer is the header that sends key, none for "".
func bearer(key string) map[string]string {
	if key == "" {
		return nil
	}
	return map[string]string{"Authorization": "Bearer " + key}
}

// twoBrokers runs the stack with two brokers in the queue group and waits
// until each counts the other.
func twoBrokers(t *testing.T) *devstack.Stack {
	st := startStack(t, devstack.Config{Brokers: 2, Replicas: devstack.ReplicasNamed("l70-gen-0", "l70-gen-1")})
	testkit.CheckFor(t, 5*time.Second, 50*time.Millisecond, func() error {
		if st.Broker(0).LiveBrokers() != 2 || st.Broker(1).LiveBrokers() != 2 {
			return errors.New("brokers have not seen each other")
		}
		return nil
	})
	return st
}

func TestTwoBrokersShareTheQuota(t *testing.T) {
	st := twoBrokers(t)
	// Tenant trial may send 5 requests a minute. Each broker enforces its
	// share, so the two together never admit more than 5.
	body := `{"model":"chat-large","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`
	ok, limited := 0, 0
	for range 12 {
		status, h := post(t, st.GatewayURL(), "sk-trial-dev", body)
		switch status {
		case 200:
			ok++
		case 429:
			limited++
			if h.Get("Retry-After") == "" || h.Get("x-ratelimit-limit-requests") == "" {
				t.Errorf("429 without Retry-After and x-ratelimit headers: %v", h)
			}
		default:
			t.Fatalf("unexpected status %d", status)
		}
	}
	if ok > 5 || ok < 3 || limited == 0 {
		t.Errorf("admitted %d and limited %d of 12; want at most 5 admitted by the two brokers together", ok, limited)
	}
}

func TestTwoBrokersSharePrefixPlacements(t *testing.T) {
	st := twoBrokers(t)
	// A long shared system prompt: many prefix blocks, no conversation id,
	// so only prefix affinity keeps the requests together.
	system := strings.Repeat("You are a careful assistant for the Switchyard platform team. ", 60)
	body := `{"model":"chat-large","max_tokens":1,"messages":[{"role":"system","content":"` + system + `"},{"role":"user","content":"q"}]}`
	status, h := post(t, st.GatewayURL(), "", body)
	if status != 200 {
		t.Fatalf("first request: %d", status)
	}
	first := h.Get("X-Switchyard-Replica")
	fr, err := features.ParseRequest("/v1/chat/completions", []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	prefix := features.AppendPrefix(nil, fr.Prompt, 256, 64)
	// knows says whether broker i, asked directly, would send the prompt to
	// the replica that holds its prefix.
	knows := func(i int) error {
		var d policy.Decision
		req := policy.Request{Tenant: "default", Model: "chat-large", Endpoint: "/v1/chat/completions", PromptTokens: fr.PromptTokens, Prefix: prefix}
		st.Broker(i).Router().Explain(&req, time.Now(), rand.New(rand.NewPCG(1, 2)), &d)
		if d.Replica != first || d.PrefixMatched != len(prefix) {
			return fmt.Errorf("broker %d would send the prompt to %s with %d/%d blocks matched (%s); want %s with all", i, d.Replica, d.PrefixMatched, len(prefix), d.Reason, first)
		}
		return nil
	}
	// The placement reaches the other broker.
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error { return errors.Join(knows(0), knows(1)) })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 16 {
		if ctx.Err() != nil {
			t.Fatal(ctx.Err())
		}
		status, h := post(t, st.GatewayURL(), "", body)
		if status != 200 {
			t.Fatalf("request %d: %d", i, status)
		}
		if rep, reason := h.Get("X-Switchyard-Replica"), h.Get("X-Switchyard-Reason"); rep != first || !strings.Contains(reason, "prefix-affinity") {
			t.Errorf("request %d went to %s (%s); the warm replica is %s", i, rep, reason, first)
		}
	}
	// Each broker, asked directly, knows where the prefix lives, whichever
	// of them made the first decision.
	for i := range 2 {
		if err := knows(i); err != nil {
			t.Error(err)
		}
		if n := decisions(t, st, i); n == 0 {
			t.Errorf("broker %d decided nothing: the queue group did not spread the requests", i)
		}
	}
}

// decisions counts the decisions broker i made, from the shared registry.
func decisions(t *testing.T, st *devstack.Stack, i int) float64 {
	return metric(st, "switchyard_broker_decisions_total", map[string]string{"broker": st.Broker(i).ID()})
}
