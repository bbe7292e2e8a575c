package test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/auth"
	"github.com/switchyard-llm/switchyard/broker"
	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/features"
	"github.com/switchyard-llm/switchyard/gateway"
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
func twoBrokers(t *testing.T, decide string) *devstack.Stack {
	st := startStack(t, devstack.Config{Brokers: 2, Replicas: devstack.ReplicasNamed("l70-gen-0", "l70-gen-1"), Gateway: gateway.Config{Decide: decide}})
	testkit.CheckFor(t, 5*time.Second, 50*time.Millisecond, func() error {
		want := 2
		if decide == gateway.DecideLocal {
			want = 3 // the gateway decides too
		}
		if st.Broker(0).LiveBrokers() != want || st.Broker(1).LiveBrokers() != want {
			return errors.New("brokers have not seen each other")
		}
		return nil
	})
	return st
}

func TestTwoBrokersShareTheQuota(t *testing.T) {
	eachDecider(t, func(t *testing.T, decide string) {
		st := twoBrokers(t, decide)
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
		// Through the brokers the queue group spreads the requests over
		// both, and each enforces half the limit: 3 to 5 admitted. A
		// gateway that decides holds all of its HTTP traffic, and the
		// brokers admitted none of the tenant's: it enforces all of it.
		least, most := 3, 5
		if decide == gateway.DecideLocal {
			least = 5
		}
		if ok > most || ok < least || limited == 0 {
			t.Errorf("admitted %d and limited %d of 12; want %d to %d admitted", ok, limited, least, most)
		}
	})
}

// TestQuotaThroughAMixedFleet: a tenant's quota admits its whole limit
// whichever part decides: one broker beside a gateway that decides (each a
// decider, but only the gateway sees the tenant's requests), or the broker
// alone behind a gateway that relays.
func TestQuotaThroughAMixedFleet(t *testing.T) {
	eachDecider(t, func(t *testing.T, decide string) {
		st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed("l70-gen-0"), Gateway: gateway.Config{Decide: decide}})
		// The deciders count each other before the tenant sends: two with
		// the gateway deciding, the broker alone with it relaying.
		testkit.CheckFor(t, 5*time.Second, 50*time.Millisecond, func() error {
			want := 1
			if decide == gateway.DecideLocal {
				want = 2
				if n := st.Gateway().Decider().LiveBrokers(); n != want {
					return fmt.Errorf("the gateway counts %d deciders, want %d", n, want)
				}
			}
			if n := st.Broker(0).LiveBrokers(); n != want {
				return fmt.Errorf("the broker counts %d deciders, want %d", n, want)
			}
			return nil
		})
		// Tenant trial may send 5 requests a minute.
		body := `{"model":"chat-large","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`
		ok, start := 0, time.Now()
		for range 8 {
			switch status, _ := post(t, st.GatewayURL(), "sk-trial-dev", body); status {
			case 200:
				ok++
			case 429:
			default:
				t.Fatalf("unexpected status %d", status)
			}
		}
		// The bucket refills a request every 12 s: a slow machine may
		// earn one more.
		if most := 5 + int(time.Since(start)/(12*time.Second)); ok < 5 || ok > most {
			t.Errorf("admitted %d of 8; the tenant's limit is 5 a minute", ok)
		}
	})
}

func TestTwoBrokersSharePrefixPlacements(t *testing.T) {
	eachDecider(t, func(t *testing.T, decide string) {
		st := twoBrokers(t, decide)
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
			req := policy.Request{Tenant: "default", Model: "chat-large", Endpoint: "/v1/chat/completions", PromptTokens: fr.PromptTokens, Prefix: prefix}
			d := st.Broker(i).Router().Explain(&req, time.Now(), rand.New(rand.NewPCG(1, 2)))
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
			// Through the brokers the queue group spreads the requests;
			// a gateway that decides makes every decision itself, and the
			// brokers know the prefix from its placements.
			if n := decisions(t, st, i); n == 0 && decide == gateway.DecideBroker {
				t.Errorf("broker %d decided nothing: the queue group did not spread the requests", i)
			}
		}
	})
}

// decisions counts the decisions broker i made, from the shared registry.
func decisions(t *testing.T, st *devstack.Stack, i int) float64 {
	return metric(st, "switchyard_broker_decisions_total", map[string]string{"broker": st.Broker(i).ID()})
}

// A broker cut off (its connection open, carrying nothing, as behind a link
// set down) stays in the queue group until the server's pings give it up,
// and NATS keeps handing it requests. None waits for it: a request no
// broker says it routed within the routed timeout is sent again, and the
// other broker takes it, every request answered well inside the accept
// timeout. When the link heals, the cut broker routes the copies it held;
// the gateway, no longer waiting for them, tells their replica to cancel
// them, and the engine finishes each request once. The gateway decides
// through the brokers (--decide broker), as NATS tenants' requests are.
func TestACutBrokerIsNotWaitedOnAndItsLateCopiesAreNotServed(t *testing.T) {
	const acceptTimeout = 3 * time.Second
	st := startStack(t, devstack.Config{Speed: 1, Replicas: devstack.ReplicasNamed("l8-gen-0"),
		Gateway: gateway.Config{Decide: gateway.DecideBroker, AcceptTimeout: acceptTimeout, RoutedTimeout: 100 * time.Millisecond}})
	// A second broker, connected through a link the test can cut.
	link := testkit.NewRelay(t, strings.TrimPrefix(st.NATSURL(), "nats://"))
	nc, err := nats.Connect(link.URL(), nats.UserCredentials(st.Creds(auth.Role{Kind: auth.RoleBroker})), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	reg := prometheus.NewRegistry()
	cut, err := broker.New(nc, broker.Config{ID: "cut-broker", Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- cut.Run(ctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Error(err)
		}
	}()
	routed := func(reg prometheus.Gatherer) float64 {
		return testkit.Sum(reg, "switchyard_broker_decisions_total", nil)
	}
	// A copy held long enough may be refused instead (its replica looks
	// dead to a broker that heard nothing for as long): served neither.
	refused := func(reg prometheus.Gatherer) float64 {
		return testkit.Sum(reg, "switchyard_broker_rejections_total", nil)
	}
	gw := func(name string) float64 { return metric(st, name, nil) }
	// Long enough (about 0.8 s at speed 1) that a cancel sent when a late
	// copy is routed reaches its adapter before the engine is done.
	body := `{"model":"chat-small","stream":true,"max_tokens":160,"messages":[{"role":"user","content":"count to two hundred"}]}`
	var answered atomic.Int64
	ask := func(what string) time.Duration {
		start := time.Now()
		status, _, b := chatOnce(t, st.GatewayURL(), body, nil)
		took := time.Since(start)
		if status != 200 || !strings.Contains(b, "[DONE]") {
			t.Errorf("%s: %d after %v: %s", what, status, took.Round(time.Millisecond), b)
			return took
		}
		answered.Add(1)
		return took
	}
	// Both brokers route, the cut one included.
	testkit.CheckFor(t, 20*time.Second, 0, func() error {
		ask("before the cut")
		if routed(reg) == 0 {
			return errors.New("the second broker has routed nothing yet")
		}
		return nil
	})

	link.Cut()
	live0, resends0 := metric(st, "switchyard_broker_decisions_total", nil), gw("switchyard_gateway_resends_total")
	// Three at a time, so that the cut is short and the cut broker still
	// counts its replicas alive when it routes what it held.
	const n, clients = 15, 3
	var slowest time.Duration
	var mu sync.Mutex
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			for i := c; i < n; i += clients {
				took := ask(fmt.Sprintf("request %d with a broker cut", i))
				mu.Lock()
				slowest = max(slowest, took)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	resent := gw("switchyard_gateway_resends_total") - resends0
	if slowest >= acceptTimeout || resent == 0 {
		t.Errorf("with a broker cut, the slowest of %d answers took %v and %v copies were sent again; want none waiting for the accept timeout (%v), and copies sent again",
			n, slowest.Round(time.Millisecond), resent, acceptTimeout)
	}
	// What the cut broker holds: every copy the live broker did not route.
	held := n + resent - (metric(st, "switchyard_broker_decisions_total", nil) - live0)
	routed0, refused0 := routed(reg), refused(reg)

	link.Heal()
	testkit.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		late := routed(reg) - routed0
		if got := late + refused(reg) - refused0; got < held {
			return fmt.Errorf("the healed broker took %v of the %v copies it held", got, held)
		}
		if c := gw("switchyard_gateway_late_routes_cancelled_total"); c < late {
			return fmt.Errorf("%v of %v late copies cancelled", c, late)
		}
		if n := st.Engine("l8-gen-0").InFlight(); n > 0 {
			return fmt.Errorf("%d requests still in the engine", n)
		}
		return nil
	})
	if got := testkit.Sum(st.Engine("l8-gen-0").Registry(), "vllm:request_success_total", nil); got != float64(answered.Load()) {
		t.Errorf("the engine finished %v requests; the clients were answered %d: a late copy was served", got, answered.Load())
	}
	t.Logf("%d requests with a broker cut, the slowest %v; %v copies sent again, %v held by the cut broker: %v routed and cancelled when it healed, %v refused",
		n, slowest.Round(time.Millisecond), resent, held, routed(reg)-routed0, refused(reg)-refused0)
}
