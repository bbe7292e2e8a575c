package test

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/auth"
	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// The prefill rate a heartbeat carries is the engine's: the simulated
// engine prefills 10,000 uncached tokens a second (its default 100 µs a
// token) at speed 1, 40,000 at the speed 4 used here, and reports the prompt tokens its prefix cache served in each
// answer's usage, as vLLM does. Streamed requests one at a time, each a
// cached system prompt and a question of its own, teach the adapter the
// rate within a fifth. The estimate from the engine's hit ratio alone
// times each first token from the fastest one seen, itself a prefill of
// a question here, and reads a rate several times the engine's.
func TestPrefillRateIsLearnedFromTheEnginesCachedTokens(t *testing.T) {
	const speed = 4
	const engineRate = 10000.0 * speed // tokens a second: enginesim's default prefill, sped up
	st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed("l8-gen-0"), Speed: speed})
	url := st.GatewayURL()
	nc := mustConnectAs(t, st, auth.Role{Kind: auth.RoleObserver})
	hbs, err := nc.SubscribeSync("llm.heartbeat.l8-gen-0")
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, 11))
	fresh := func(words int) string {
		var b strings.Builder
		for range words {
			fmt.Fprintf(&b, "w%d ", rng.IntN(1<<30))
		}
		return b.String()
	}
	// Every prompt is a system prompt the cache holds and a question of
	// its own, as in the lab's prefix benchmark: no first token is a bare
	// base TTFT, and the cache's hits are all on the system prompt.
	system := fresh(1500)
	sent := 0
	prompt := func() string {
		sent++
		return system + fresh(150+rng.IntN(1000))
	}
	var rate float64
	testkit.CheckFor(t, 30*time.Second, 0, func() error {
		p := prompt()
		body, _ := json.Marshal(map[string]any{"model": "chat-small", "max_tokens": 1, "stream": true,
			"stream_options": map[string]any{"include_usage": true},
			"messages":       []map[string]string{{"role": "user", "content": p}}})
		if code, _, b := chatOnce(t, url, string(body), nil); code != 200 {
			return fmt.Errorf("request: %d %s", code, b)
		}
		for {
			m, err := hbs.NextMsg(0)
			if err != nil {
				break // the heartbeats so far are read
			}
			var hb subjects.Heartbeat
			if err := json.Unmarshal(m.Data, &hb); err != nil {
				t.Fatal(err)
			}
			rate = hb.PrefillTokensPerSec
		}
		if sent < 30 || math.Abs(rate-engineRate) > engineRate/5 {
			return fmt.Errorf("after %d requests the heartbeat's prefill rate is %.0f tokens/s, the engine's %.0f", sent, rate, engineRate)
		}
		return nil
	})
	t.Logf("prefill rate %.0f tokens/s after %d requests (the engine's: %.0f)", rate, sent, engineRate)
}
