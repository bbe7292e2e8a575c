package test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/features"
	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// The brokers route on what the engines cache: request P lands on replica
// A; other prompts fill A's KV cache until its engine evicts P's blocks;
// the next request with P's prefix is not sent to A for prefix affinity.
// With the feed off the brokers only know where they sent P, and send it
// back to A, cache or no cache: the same check fails.
func TestKVEventsRouteOnWhatTheEnginesCache(t *testing.T) {
	t.Run("feed on", func(t *testing.T) {
		if err := evictedPrefixAvoided(t, false); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("feed off", func(t *testing.T) {
		if err := evictedPrefixAvoided(t, true); err == nil {
			t.Fatal("without the KV-event feed the evicted prefix was avoided all the same: the check cannot tell the feed's work")
		} else {
			t.Logf("as expected without the feed: %v", err)
		}
	})
}

func evictedPrefixAvoided(t *testing.T, noFeed bool) error {
	t.Helper()
	replicas := devstack.ReplicasNamed("l70-gen-0", "l70-gen-1")
	for i := range replicas {
		replicas[i].KVBlocks = 256 // 4,096 tokens: a few prompts fill it
	}
	st := startStack(t, devstack.Config{Replicas: replicas, NoKVEvents: noFeed})
	chatBody := func(system string) string {
		return `{"model":"chat-large","max_tokens":1,"messages":[{"role":"system","content":"` + system + `"},{"role":"user","content":"q"}]}`
	}
	long := func(seed string) string { return strings.Repeat(seed+" ", 2800/(len(seed)+1)) }
	send := func(body string) (replica, reason string) {
		t.Helper()
		status, h := post(t, st.GatewayURL(), "", body)
		if status != 200 {
			t.Fatalf("status %d", status)
		}
		return h.Get("X-Switchyard-Replica"), h.Get("X-Switchyard-Reason")
	}
	if !noFeed {
		// The engines' feeds are up once the broker's index holds keys.
		n := 0
		testkit.CheckFor(t, 15*time.Second, 100*time.Millisecond, func() error {
			entries := 0
			st.Broker(0).Router().PrefixIndexEntries(func(_ string, e int) { entries += e })
			if entries > 0 {
				return nil
			}
			n++
			send(chatBody(long(fmt.Sprintf("warm-up prompt number %d", n))))
			return errors.New("no key in the broker's index yet")
		})
	}

	pBody := chatBody(long("You are the careful assistant of the Switchyard platform team"))
	a, _ := send(pBody)
	fr, err := features.ParseRequest("/v1/chat/completions", []byte(pBody))
	if err != nil {
		t.Fatal(err)
	}
	prefix := features.AppendPrefix(nil, fr.Prompt, 256, 64)
	explain := func() policy.Decision {
		var d policy.Decision
		req := policy.Request{Tenant: "default", Model: "chat-large", Endpoint: "/v1/chat/completions", PromptTokens: fr.PromptTokens, Prefix: prefix}
		st.Broker(0).Router().Explain(&req, time.Now(), rand.New(rand.NewPCG(1, 2)), &d)
		return d
	}
	want := policy.PrefixPlacements
	if !noFeed {
		want = policy.PrefixKVEvents
	}
	// P is held on A, as the broker knows it.
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if d := explain(); d.Replica != a || d.PrefixSource != want || d.PrefixMatched == 0 {
			return fmt.Errorf("P would go to %s (%s) with %d blocks from %q; want %s from %s", d.Replica, d.Reason, d.PrefixMatched, d.PrefixSource, a, want)
		}
		return nil
	})

	// Other prompts fill both caches many times over: 40 prompts of about
	// 45 blocks against 256 blocks each.
	for i := range 40 {
		send(chatBody(long(fmt.Sprintf("an unrelated prompt %d about something else entirely", i))))
	}
	if !noFeed {
		// The eviction reaches the broker.
		testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
			if d := explain(); d.PrefixSource == policy.PrefixKVEvents && d.Replica == a {
				return fmt.Errorf("the broker still holds P's keys on %s (%d blocks)", a, d.PrefixMatched)
			}
			return nil
		})
	}
	rep, reason := send(pBody)
	if rep == a && strings.Contains(reason, policy.ReasonPrefix) {
		return fmt.Errorf("P went back to %s for prefix affinity (%s) after its engine evicted P's blocks", a, reason)
	}
	return nil
}
