package adapter_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// TestEngineFailureStreak: the heartbeat carries the engine's streak of
// failed answers, which brokers eject on. 5xx, 429, connection failures
// and a 404 for the model the replica registered count; a client's own
// 4xx does not, nor a 404 for a LoRA adapter the engine has not loaded, and a success ends the streak. The heartbeat that
// completes a streak goes at once.
func TestEngineFailureStreak(t *testing.T) {
	e := newEnv(t)
	var status atomic.Int32
	e.eng.handle(func(w http.ResponseWriter, r *http.Request) {
		code := int(status.Load())
		w.Header().Set("Content-Type", "application/json")
		switch code {
		case http.StatusOK:
			w.WriteHeader(code)
			_, _ = w.Write(golden(t, "vllm/chat-completion.json"))
		case http.StatusNotFound:
			w.WriteHeader(code)
			_, _ = w.Write(golden(t, "vllm/error-unknown-model.json"))
		case http.StatusBadRequest: // the client's own error
			w.WriteHeader(code)
			_, _ = w.Write([]byte(`{"error":{"message":"temperature must be at most 2","type":"BadRequestError","param":"temperature","code":400}}`))
		default:
			w.WriteHeader(code)
			_, _ = w.Write([]byte(`{"error":{"message":"engine failed","type":"InternalServerError","code":` + fmt.Sprint(code) + `}}`))
		}
	})
	cfg := e.config()
	cfg.HeartbeatEvery = 1 << 40 // only the heartbeats sent on events
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	nextHB := heartbeats(t, e.nc, cfg.Replica)
	e.start(cfg)
	call := func(code int, n int) {
		status.Store(int32(code))
		for i := range n {
			h := chatHeaders(fmt.Sprintf("q-%d-%d", code, i))
			h.Del(subjects.HdrStream)
			untilEnd(t, e.request(cfg.Replica, h, `{"model":"sim-model"}`))
		}
	}
	call(http.StatusOK, 1)
	call(http.StatusBadRequest, 3) // the client's own error
	// A 404 for a tenant's LoRA adapter the engine has not loaded is that
	// tenant's, relayed as it came: it neither counts nor ends the streak.
	status.Store(http.StatusNotFound)
	h := chatHeaders("q-lora")
	h.Del(subjects.HdrStream)
	h.Set(subjects.HdrRouteLora, "acme-lora")
	if msgs := untilEnd(t, e.request(cfg.Replica, h, `{"model":"sim-model"}`)); msgs[len(msgs)-1].Header.Get(subjects.HdrStatus) != "404" {
		t.Fatalf("a LoRA adapter's 404 answered %s, want the engine's 404", msgs[len(msgs)-1].Header.Get(subjects.HdrStatus))
	}
	call(http.StatusServiceUnavailable, 2)
	call(http.StatusTooManyRequests, 1)
	call(http.StatusNotFound, 1) // the engine does not serve the replica's model
	call(http.StatusInternalServerError, subjects.EjectAfterFailures-4)
	hb := waitHeartbeat(t, nextHB, func(hb subjects.Heartbeat) error {
		if hb.EngineFailures < subjects.EjectAfterFailures {
			return fmt.Errorf("engine_failures %d", hb.EngineFailures)
		}
		return nil
	})
	if hb.EngineFailures != subjects.EjectAfterFailures || hb.EngineSuccesses != 1 {
		t.Fatalf("engine_failures %d successes %d, want %d and 1 (400s are the client's)", hb.EngineFailures, hb.EngineSuccesses, subjects.EjectAfterFailures)
	}
	for kind, want := range map[string]float64{"429": 1, "5xx": 3, "model": 1, "auth": 0, "connection": 0} {
		if got := counter(t, reg, "switchyard_adapter_engine_failures_total", "kind", kind); got != want {
			t.Errorf("engine failures of kind %s: %v, want %v", kind, got, want)
		}
	}
}

// TestEngineAPIKey: the adapter sends the engine's key as a bearer token;
// an engine that refuses it (vLLM started with another --api-key) keeps
// answering /health and /metrics, yet the replica turns unhealthy at once,
// counted once however many requests are refused, and healthy again when
// the engine takes the key.
func TestEngineAPIKey(t *testing.T) {
	e := newEnv(t)
	e.eng.handle(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(golden(t, "vllm/chat-completion.json"))
	})
	e.eng.key.Store("s3cret")
	cfg := e.config()
	cfg.EngineAPIKey = "s3cret"
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	nextHB := heartbeats(t, e.nc, cfg.Replica)
	e.start(cfg)
	var lastBody string
	ask := func(id string) string {
		h := chatHeaders(id)
		h.Del(subjects.HdrStream)
		msgs := untilEnd(t, e.request(cfg.Replica, h, `{"model":"sim-model"}`))
		lastBody = string(msgs[len(msgs)-1].Data)
		return msgs[len(msgs)-1].Header.Get(subjects.HdrStatus)
	}
	if st := ask("with-key"); st != "200" {
		t.Fatalf("with the key: %s", st)
	}
	if got := e.eng.requests()[0].Header.Get("Authorization"); got != "Bearer s3cret" {
		t.Fatalf("engine saw Authorization %q", got)
	}

	e.eng.key.Store("rotated")
	for i := range 3 {
		// The client's key was fine: it hears a retryable 503, not the
		// engine's 401 invalid_api_key.
		if st := ask(fmt.Sprint("refused-", i)); st != "503" || !strings.Contains(lastBody, subjects.CodeUpstreamError) {
			t.Fatalf("refused key answered %s %s, want 503 upstream_error", st, lastBody)
		}
	}
	waitHeartbeat(t, nextHB, func(hb subjects.Heartbeat) error {
		if hb.ScrapeOK || !hb.AuthFailed {
			return fmt.Errorf("scrape_ok %v auth_failed %v", hb.ScrapeOK, hb.AuthFailed)
		}
		return nil
	})
	if n := counter(t, reg, "switchyard_adapter_engine_auth_failures_total", "", ""); n != 1 {
		t.Fatalf("auth failures counted %v times, want once", n)
	}

	e.eng.key.Store("s3cret")
	waitHeartbeat(t, nextHB, func(hb subjects.Heartbeat) error {
		if !hb.ScrapeOK || hb.AuthFailed {
			return fmt.Errorf("scrape_ok %v auth_failed %v", hb.ScrapeOK, hb.AuthFailed)
		}
		return nil
	})
}

// counter reads a counter of reg: the series whose label has value (all of
// them when label is "").
func counter(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	var want map[string]string
	if label != "" {
		want = map[string]string{label: value}
	}
	return testkit.Sum(reg, name, want)
}
