package test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/features"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
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
		req := policy.Request{Tenant: "default", Model: "chat-large", Endpoint: "/v1/chat/completions", PromptTokens: fr.PromptTokens, Prefix: prefix}
		d := st.Broker(0).Router().Explain(&req, time.Now(), rand.New(rand.NewPCG(1, 2)))
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

// Every identity that may ask the adapters to resend their keys
// (llm.kvsync) could ask in a loop, and a resend is every key an engine
// holds. A gateway's creds flooding the subject cost each adapter at most
// one resend a second, every ask counted, and a broker that starts during
// the flood has the full index within 2 s all the same.
func TestAKVSyncFloodCostsOneResendASecond(t *testing.T) {
	replicas := devstack.ReplicasNamed("l70-gen-0", "l70-gen-1")
	for i := range replicas {
		replicas[i].KVBlocks = 256
	}
	st := startStack(t, devstack.Config{Replicas: replicas})
	ids := []string{"l70-gen-0", "l70-gen-1"}
	// Both engines hold keys, and the broker knows them.
	n := 0
	testkit.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		for _, id := range ids {
			if r := st.Broker(0).Router(); !r.KVSynced(id) || r.KVKeys(id) == 0 {
				n++
				body := `{"model":"chat-large","max_tokens":1,"messages":[{"role":"user","content":"` +
					strings.Repeat(fmt.Sprintf("warm-up prompt %d ", n), 60) + `"}]}`
				if status, _ := post(t, st.GatewayURL(), "", body); status != 200 {
					t.Fatalf("status %d", status)
				}
				return fmt.Errorf("the broker holds no key of %s yet", id)
			}
		}
		return nil
	})
	held := map[string]int{}
	for _, id := range ids {
		held[id] = st.Broker(0).Router().KVKeys(id)
	}
	st.StopBroker(0)

	// What every decider hears: the resends, per replica.
	witness := mustConnectAs(t, st, roleBroker)
	var mu sync.Mutex
	resends := map[string]int{}
	if _, err := witness.Subscribe("llm.kv.*", func(m *nats.Msg) {
		var u subjects.KVUpdate
		if json.Unmarshal(m.Data, &u) == nil && u.Resend {
			mu.Lock()
			resends[u.Replica]++
			mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := witness.Flush(); err != nil {
		t.Fatal(err)
	}
	asked := func(id, outcome string) int {
		return int(metric(st, "switchyard_adapter_kv_sync_requests_total", map[string]string{"replica": id, "outcome": outcome}))
	}
	before := map[string]int{}
	for _, id := range ids {
		before[id] = asked(id, "resent")
	}

	// Three seconds of asks, one a millisecond, with a gateway's creds.
	flood := mustConnectAs(t, st, roleRelay)
	start := time.Now()
	stop := make(chan struct{})
	flooded := make(chan int)
	go func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		asks := 0
		for {
			select {
			case <-stop:
				_ = flood.Flush()
				flooded <- asks
				return
			case <-tick.C:
				if flood.Publish("llm.kvsync", nil) == nil {
					asks++
				}
			}
		}
	}()
	// Halfway, the broker starts again: it has every key within 2 s.
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if time.Since(start) < 1500*time.Millisecond {
			return errors.New("flooding")
		}
		return nil
	})
	if err := st.StartBroker(0); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 2*time.Second, 10*time.Millisecond, func() error {
		for _, id := range ids {
			if r := st.Broker(0).Router(); !r.KVSynced(id) || r.KVKeys(id) != held[id] {
				return fmt.Errorf("the restarted broker holds %d of %s's %d keys (synced %v)", r.KVKeys(id), id, held[id], r.KVSynced(id))
			}
		}
		return nil
	})
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if time.Since(start) < 3*time.Second {
			return errors.New("flooding")
		}
		return nil
	})
	close(stop)
	asks := <-flooded

	// Every ask is counted, and the last second's share its resend.
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			if got := asked(id, "resent") + asked(id, "coalesced"); got < asks {
				return fmt.Errorf("%s counted %d of at least %d asks", id, got, asks)
			}
			// (One more may be heard: a resend the stack's own parts
			// asked for just before the flood.)
			if resends[id] < asked(id, "resent")-before[id] {
				return fmt.Errorf("%s: %d resends heard, %d counted", id, resends[id], asked(id, "resent")-before[id])
			}
		}
		return nil
	})
	// One at the first ask, one at the end of every second that had asks,
	// and the one asked for before the flood.
	elapsed := time.Since(start)
	bound := int(elapsed/time.Second) + 3
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if resends[id] == 0 || resends[id] > bound {
			t.Errorf("%s: %d asks in %v made %d resends, want 1 to %d", id, asks, elapsed, resends[id], bound)
		}
	}
	t.Logf("%d asks in %v: resends %v", asks, elapsed, resends)
}
