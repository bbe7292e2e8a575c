package test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/auth"
	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// A TTFT objective no replica can meet, through `switchyard dev`: once the
// replica's heartbeat carries its measured time to first token, a request
// holding it to 1 ms is refused at once with 503 ttft_objective_unreachable
// and a Retry-After, while one with a generous objective is served.
func TestUnreachableTTFTObjectiveIsRefused(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed("l8-gen-0")})
	url := st.GatewayURL()
	body := chatBody("chat-small", 4, false)
	if code, _, b := chatOnce(t, url, body, map[string]string{"X-Switchyard-TTFT-Objective": "1m"}); code != 200 {
		t.Fatalf("generous objective: %d %s", code, b)
	}
	testkit.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		// Streamed traffic (only a stream's first byte is a time to
		// first token) keeps the replica's measured TTFT up until a
		// heartbeat carries it.
		if code, _, b := chatOnce(t, url, chatBody("chat-small", 4, true), nil); code != 200 {
			return fmt.Errorf("warm-up request: %d %s", code, b)
		}
		code, h, b := chatOnce(t, url, body, map[string]string{"X-Switchyard-TTFT-Objective": "1ms"})
		if code == 200 {
			return fmt.Errorf("a 1ms objective was served by %s: no TTFT measured yet", h.Get("X-Switchyard-Replica"))
		}
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if err := json.Unmarshal([]byte(b), &e); err != nil {
			t.Fatalf("not the OpenAI error shape: %s", b)
		}
		if code != http.StatusServiceUnavailable || e.Error.Code != "ttft_objective_unreachable" {
			t.Fatalf("1ms objective: %d %s, want 503 ttft_objective_unreachable", code, b)
		}
		if secs, err := strconv.Atoi(h.Get("Retry-After")); err != nil || secs < 1 {
			t.Fatalf("Retry-After %q, want whole seconds ≥ 1", h.Get("Retry-After"))
		}
		if h.Get("Retry-After-Ms") == "" {
			t.Fatalf("no retry-after-ms: %v", h)
		}
		return nil
	})
	if code, _, b := chatOnce(t, url, body, map[string]string{"X-Switchyard-TTFT-Objective": "1m"}); code != 200 {
		t.Fatalf("generous objective after the refusal: %d %s", code, b)
	}
	if code, _, b := chatOnce(t, url, body, map[string]string{"X-Switchyard-TTFT-Objective": "fast"}); code != 400 {
		t.Fatalf("objective \"fast\": %d %s, want 400", code, b)
	}

	// The adapter learns the replica's prefill rate from streamed first
	// tokens of long prompts, and its heartbeat carries it to the brokers.
	nc := mustConnectAs(t, st, auth.Role{Kind: auth.RoleObserver})
	hbs, err := nc.SubscribeSync("llm.heartbeat.l8-gen-0")
	if err != nil {
		t.Fatal(err)
	}
	long := `{"model":"chat-small","max_tokens":2,"stream":true,"messages":[{"role":"user","content":"` +
		strings.Repeat("a story of many words ", 400) + `"}]}`
	testkit.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		if code, _, b := chatOnce(t, url, long, nil); code != 200 {
			return fmt.Errorf("long prompt: %d %s", code, b)
		}
		m, err := hbs.NextMsg(2 * time.Second)
		if err != nil {
			return err
		}
		var hb subjects.Heartbeat
		if err := json.Unmarshal(m.Data, &hb); err != nil {
			t.Fatal(err)
		}
		if hb.PrefillTokensPerSec <= 0 {
			return fmt.Errorf("heartbeat without a prefill rate: %s", m.Data)
		}
		return nil
	})
}

// Non-streamed answers teach the replicas' TTFT as streamed ones do: the
// adapters read it from the engines' own time_to_first_token histograms.
// A fresh stack has no TTFT evidence and says so in its decisions rather
// than predicting 0 ms, so a 1ms objective is not judged; within 3 s of
// the eighth non-streamed answer (one scrape and one heartbeat at the
// defaults), the same objective is refused for the TTFT they measured.
func TestNonStreamedTrafficTeachesTTFT(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed("l8-gen-0", "l8-gen-1")})
	url := st.GatewayURL()
	nc := mustConnectAs(t, st, roleOperator)
	explain := func() subjects.Decision {
		t.Helper()
		return explainOver(t, nc, []byte(`{"model":"chat-small","ttft_objective":"1ms"}`))
	}
	d := explain()
	if d.Code != "" || !d.NoTTFTEvidence || d.PredictedTTFTMillis != 0 {
		t.Fatalf("a fresh stack decided %+v; want no TTFT evidence, no prediction and the objective not judged", d)
	}

	body := chatBody("chat-small", 4, false)
	for i := range 8 {
		if code, _, b := chatOnce(t, url, body, nil); code != 200 {
			t.Fatalf("non-streamed request %d: %d %s", i, code, b)
		}
	}
	answered := time.Now()
	var refused time.Duration
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		code, h, b := chatOnce(t, url, body, map[string]string{"X-Switchyard-TTFT-Objective": "1ms"})
		if code == 200 {
			return fmt.Errorf("a 1ms objective was served by %s: no TTFT learned from non-streamed answers", h.Get("X-Switchyard-Replica"))
		}
		if code != http.StatusServiceUnavailable || !strings.Contains(b, "ttft_objective_unreachable") {
			t.Fatalf("1ms objective: %d %s, want 503 ttft_objective_unreachable", code, b)
		}
		refused = time.Since(answered)
		return nil
	})
	if refused > 3*time.Second {
		t.Errorf("the 1ms objective was first refused %v after the eighth answer, want within 3s", refused)
	}
	if d := explain(); d.NoTTFTEvidence || d.Code != subjects.CodeTTFTObjectiveUnreachable {
		t.Errorf("after the non-streamed answers explain says %+v; want the objective refused on measured TTFT", d)
	}
	t.Logf("1ms objective refused %v after the eighth non-streamed answer", refused.Round(time.Millisecond))
}
