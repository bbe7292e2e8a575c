package test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// A tenant flooding one pool, through `switchyard dev`: once the pool sheds
// (its replica's predicted time to first token is above the pool's
// shed_after), the flooding tenant's requests beyond its share of the
// pool's tokens in flight are refused at once with 429 fair_share_exceeded
// and a Retry-After, in the OpenAI error shape, while another tenant's
// requests in the same seconds are served.
func TestAFloodingTenantIsShedAndTheOtherServed(t *testing.T) {
	eachDecider(t, func(t *testing.T, decide string) {
		st := startStack(t, devstack.Config{Gateway: gateway.Config{Decide: decide}, Replicas: devstack.ReplicasNamed("l8-gen-0")})
		kv := kvBucket(t, st)
		if _, err := kv.Put(context.Background(), "pools.general", []byte(`{"shed_after": "1ms"}`)); err != nil {
			t.Fatal(err)
		}
		url := st.GatewayURL()
		flood := map[string]string{"Authorization": "Bearer sk-intern-dev"}
		other := map[string]string{"Authorization": "Bearer sk-default-dev"}
		testkit.CheckFor(t, 60*time.Second, 100*time.Millisecond, func() error {
			// Streamed traffic gives the replica a measured TTFT, which its
			// heartbeat carries: from then on the pool sheds.
			if code, _, b := chatOnce(t, url, chatBody("chat-small", 2, true), other); code != 200 {
				t.Fatalf("warm-up: %d %s", code, b)
			}
			r := floodRound(t, url, flood, other)
			if len(r.otherFailed) > 0 {
				t.Fatalf("the tenant within its share was refused: %v", r.otherFailed)
			}
			if r.refused == 0 {
				return fmt.Errorf("no flooding request refused yet (%d served)", r.served)
			}
			if r.firstRefused.After(r.lastOther) || r.lastOther.Sub(r.firstRefused) > 10*time.Second {
				t.Fatalf("the other tenant's last 200 at %v, the first refusal at %v: not the same seconds", r.lastOther, r.firstRefused)
			}
			t.Logf("flood: %d served, %d refused; the other tenant: %d served", r.served, r.refused, r.otherServed)
			return nil
		})
	})
}

// round is what the two tenants of a flood saw.
type round struct {
	served, refused, otherServed int
	otherFailed                  []string
	firstRefused, lastOther      time.Time
}

// floodRound runs 8 clients of the flooding tenant, 4 long requests each,
// while 2 clients of the other tenant send short requests one after the
// other until the flood ends. Every refusal of the flood must be the fair
// share's, complete with its Retry-After.
func floodRound(t *testing.T, url string, flood, other map[string]string) *round {
	t.Helper()
	var (
		mu   sync.Mutex
		r    round
		wg   sync.WaitGroup
		done = make(chan struct{})
	)
	for range 8 {
		wg.Go(func() {
			for range 4 {
				code, h, b := chatOnce(t, url, chatBody("chat-small", 256, false), flood)
				now := time.Now()
				mu.Lock()
				switch code {
				case http.StatusOK:
					r.served++
				case http.StatusTooManyRequests:
					checkFairShareRefusal(t, h, b)
					if r.refused == 0 {
						r.firstRefused = now
					}
					r.refused++
				default:
					t.Errorf("flooding request: %d %s", code, b)
				}
				mu.Unlock()
			}
		})
	}
	var others sync.WaitGroup
	for range 2 {
		others.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				code, _, b := chatOnce(t, url, chatBody("chat-small", 32, false), other)
				now := time.Now()
				mu.Lock()
				if code == http.StatusOK {
					r.otherServed++
					r.lastOther = now
				} else {
					r.otherFailed = append(r.otherFailed, strconv.Itoa(code)+" "+b)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(done)
	others.Wait()
	return &r
}

// checkFairShareRefusal fails unless a 429 is fair_share_exceeded in the
// OpenAI error shape, with a Retry-After of whole seconds ≥ 1.
func checkFairShareRefusal(t *testing.T, h http.Header, body string) {
	t.Helper()
	var e struct {
		Error struct{ Message, Type, Code string } `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Errorf("not the OpenAI error shape: %s", body)
		return
	}
	if e.Error.Code != "fair_share_exceeded" || e.Error.Type != "rate_limit_error" || e.Error.Message == "" {
		t.Errorf("429 %s, want fair_share_exceeded (rate_limit_error) with a message", body)
	}
	if secs, err := strconv.Atoi(h.Get("Retry-After")); err != nil || secs < 1 {
		t.Errorf("Retry-After %q, want whole seconds ≥ 1", h.Get("Retry-After"))
	}
}
