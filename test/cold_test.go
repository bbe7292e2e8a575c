package test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/sse"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/table"
)

const mixtral = "mixtral-8x22b"

// chatOnce sends one chat request and returns its status, headers and body;
// a request unanswered within a minute fails the test.
func chatOnce(t *testing.T, url, body string, hdr map[string]string) (int, http.Header, string) {
	t.Helper()
	return postOnce(t, url+"/v1/chat/completions", body, hdr)
}

// postOnce is chatOnce for any endpoint.
func postOnce(t *testing.T, url, body string, hdr map[string]string) (int, http.Header, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// The cold model in `switchyard dev`: many requests on two brokers while it
// is cold get 503 model_loading with the load's Retry-After and start one
// load; it then serves; idle, it is drained and unloaded; the next request
// loads it again.
func TestColdModelLoadsOnceServesUnloadsAndReloads(t *testing.T) {
	eachDecider(t, func(t *testing.T, decide string) {
		const speed = 10 // a 2 s load
		st := startStack(t, devstack.Config{Gateway: gateway.Config{Decide: decide}, Brokers: 2, Replicas: devstack.ReplicasNamed("l8-gen-0"), Speed: speed})
		url := st.GatewayURL()
		body := chatBody("mixtral", 4, false)

		var wg sync.WaitGroup
		var mu sync.Mutex
		codes := map[string]int{}
		for range 20 {
			wg.Go(func() {
				status, h, b := chatOnce(t, url, body, nil)
				mu.Lock()
				defer mu.Unlock()
				if status == 503 && strings.Contains(b, `"model_loading"`) {
					codes["model_loading"]++
					if ra, _ := strconv.Atoi(h.Get("Retry-After")); ra < 1 || ra > 3 {
						t.Errorf("Retry-After = %q, want about the 2 s load", h.Get("Retry-After"))
					}
					return
				}
				codes[strconv.Itoa(status)]++
			})
		}
		wg.Wait()
		if codes["model_loading"] == 0 {
			t.Fatalf("answers while cold = %v, want 503 model_loading", codes)
		}
		took := testkit.CheckFor(t, time.Minute, 10*time.Millisecond, func() error {
			status, h, b := chatOnce(t, url, body, nil)
			if status != 200 {
				return &answerErr{status, b}
			}
			if r := h.Get("X-Switchyard-Replica"); r != "mixtral-gen-0" {
				t.Errorf("served by %q, want mixtral-gen-0", r)
			}
			return nil
		})

		t.Logf("first 200 %s after the 503s", took.Round(10*time.Millisecond))
		if n := metric(st, "switchyard_loader_loads_total", map[string]string{"model": mixtral, "outcome": "ready"}); n != 1 {
			t.Errorf("loads ready = %v, want 1 for %d requests on two brokers", n, 20)
		}

		// Idle: drained, unloaded, and loaded again by the next request.
		kv := kvBucket(t, st)
		ctx := context.Background()
		if _, err := kv.Put(ctx, "models."+mixtral, []byte(`{"versions": ["v1.0.0"], "tier": "cold", "idle_unload_after": "1s", "expected_load_seconds": 2}`)); err != nil {
			t.Fatal(err)
		}
		testkit.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
			if metric(st, "switchyard_loader_unloads_total", map[string]string{"model": mixtral, "outcome": "unloaded"}) != 1 {
				return errors.New("not unloaded")
			}
			return nil
		})
		testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
			_, err := kv.Get(ctx, "replicas.mixtral-gen-0")
			if err == nil {
				return errors.New("the unloaded replica is still registered")
			}
			return nil
		})
		if status, _, b := chatOnce(t, url, body, nil); status != 503 || !strings.Contains(b, "model_loading") {
			t.Fatalf("after the unload: %d %s, want 503 model_loading", status, b)
		}
		testkit.CheckFor(t, time.Minute, 10*time.Millisecond, func() error {
			if status, _, b := chatOnce(t, url, body, nil); status != 200 {
				return &answerErr{status, b}
			}
			return nil
		})

		if n := metric(st, "switchyard_loader_loads_total", map[string]string{"model": mixtral, "outcome": "ready"}); n != 2 {
			t.Errorf("loads ready = %v, want 2", n)
		}
	})
}

type answerErr struct {
	status int
	body   string
}

func (e *answerErr) Error() string { return strconv.Itoa(e.status) + " " + e.body }

// holdWhileCold writes mixtral's table entry, one with on_cold "wait", and
// waits until the gateway has seen it.
func holdWhileCold(t *testing.T, st *devstack.Stack, entry string) {
	t.Helper()
	if _, err := kvBucket(t, st).Put(context.Background(), "models."+mixtral, []byte(entry)); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		m := st.Gateway().Table().Models[mixtral]
		if m == nil || m.OnCold != table.OnColdWait {
			return errors.New("the gateway has not seen on_cold: wait")
		}
		return nil
	})
}

// on_cold "wait": the gateway holds the request until the model is ready,
// within the request's deadline; a deadline shorter than the load gets the
// 503 it would have got. A held stream gets SSE comments while it waits.
func TestOnColdWaitHoldsUntilReady(t *testing.T) {
	eachDecider(t, func(t *testing.T, decide string) {
		const speed = 10 // a 2 s load
		st := startStack(t, devstack.Config{Gateway: gateway.Config{Decide: decide}, Replicas: devstack.ReplicasNamed("l8-gen-0"), Speed: speed})
		url := st.GatewayURL()
		holdWhileCold(t, st, `{"versions": ["v1.0.0"], "tier": "cold", "on_cold": "wait", "expected_load_seconds": 2}`)

		// Half a second is not enough for a 2 s load: the 503, after the wait.
		began := time.Now()
		status, h, b := chatOnce(t, url, chatBody("mixtral", 4, false), map[string]string{"X-Request-Timeout": "0.5"})
		if status != 503 || !strings.Contains(b, `"model_loading"`) || h.Get("Retry-After") == "" {
			t.Fatalf("short deadline: %d %s, want 503 model_loading with Retry-After", status, b)
		}
		if waited := time.Since(began); waited < 400*time.Millisecond {
			t.Errorf("the short-deadline request was answered after %s: it was not held", waited)
		}
		// A held stream is already 200: its 503 is the stream's error line.
		status, _, b = chatOnce(t, url, chatBody("mixtral", 4, true), map[string]string{"X-Request-Timeout": "0.5"})
		if status != 200 || !strings.HasPrefix(b, ": waiting for "+mixtral+" to load\n\n") ||
			!strings.Contains(b, "\n\ndata: {\"error\":{") || strings.Contains(b, "event: error") ||
			!strings.Contains(b, `"model_loading"`) || strings.Contains(b, "[DONE]") {
			t.Errorf("held stream past its deadline: %d %q, want 200, the comment, then an error line with model_loading", status, b)
		}

		// A held Responses stream ends as every Responses stream that fails
		// does: an error event in the Responses shape, not chat's error object.
		status, _, b = postOnce(t, url+"/v1/responses", `{"model":"mixtral","input":"tell me a story","max_output_tokens":4,"stream":true}`,
			map[string]string{"X-Request-Timeout": "0.5"})
		if status != 200 || !strings.HasPrefix(b, ": waiting for "+mixtral+" to load\n\n") ||
			!strings.Contains(b, "\n\nevent: error\ndata: {\"type\":\"error\",\"code\":\"model_loading\"") ||
			strings.Contains(b, `{"error":{`) {
			t.Errorf("held Responses stream past its deadline: %d %q, want 200, the comment, then a Responses error event with model_loading", status, b)
		}

		// Thirty seconds cover it: a plain request and a stream, both held.
		var wg sync.WaitGroup
		wg.Go(func() {
			status, _, b := chatOnce(t, url, chatBody("mixtral", 4, false), map[string]string{"X-Request-Timeout": "30"})
			if status != 200 || !strings.Contains(b, `"choices"`) {
				t.Errorf("held request: %d %s, want 200", status, b)
			}
		})
		wg.Go(func() {
			status, h, b := chatOnce(t, url, chatBody("mixtral", 4, true), map[string]string{"X-Request-Timeout": "30"})
			if status != 200 || !strings.HasPrefix(b, ": waiting for "+mixtral+" to load") || !strings.Contains(b, "data: [DONE]") || strings.Contains(b, "event: error") {
				t.Errorf("held stream: %d %q, want 200, a waiting comment, then the stream to [DONE]", status, b)
			}
			if ct := h.Get("Content-Type"); !sse.IsEventStream(ct) {
				t.Errorf("held stream Content-Type = %q", ct)
			}
		})
		wg.Wait()
		if n := metric(st, "switchyard_gateway_cold_waits_total", map[string]string{"outcome": "ready"}); n < 2 {
			t.Errorf("cold waits ended ready = %v, want ≥ 2", n)
		}
		if n := metric(st, "switchyard_gateway_cold_waits_total", map[string]string{"outcome": "deadline"}); n != 3 {
			t.Errorf("cold waits ended at the deadline = %v, want 3", n)
		}
	})
}

// `switchyard dev` itself: mixtral answers 503 model_loading first, then
// 200 within a minute (at --speed 20 its load takes a second).
func TestDevServesTheColdModel(t *testing.T) {
	bin := binary(t)
	var out, errs testkit.SyncBuffer
	dev := exec.Command(bin, "dev", "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:-1", "--data", t.TempDir(), "--speed", "20")
	dev.Stdout, dev.Stderr = &out, &errs
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- dev.Wait() }()
	t.Cleanup(func() {
		_ = dev.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = dev.Process.Kill()
			<-done
		}
	})
	gwRE := regexp.MustCompile(`gateway\s+(http://\S+)`)
	var gw string
	testkit.CheckFor(t, 60*time.Second, 10*time.Millisecond, func() error {
		m := gwRE.FindStringSubmatch(out.String())
		if m == nil {
			return errors.New("dev has not printed its URL: " + errs.String())
		}
		gw = m[1]
		return nil
	})

	body := chatBody("mixtral", 4, false)
	status, h, b := chatOnce(t, gw, body, nil)
	if status != 503 || !strings.Contains(b, `"model_loading"`) || h.Get("Retry-After") == "" {
		t.Fatalf("first mixtral request: %d %s, want 503 model_loading with Retry-After", status, b)
	}
	took := testkit.CheckFor(t, time.Minute, 10*time.Millisecond, func() error {
		if status, _, b := chatOnce(t, gw, body, nil); status != 200 {
			return &answerErr{status, b}
		}
		return nil
	})

	t.Logf("mixtral: 503 model_loading (Retry-After %s), then 200 after %s at --speed 20", h.Get("Retry-After"), took.Round(10*time.Millisecond))
}

// The requests held per gateway are bounded (--max-cold-waits): one more
// gets the 503 at once.
func TestColdWaitsAreBounded(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed("l8-gen-0"), Speed: 1, ColdLoad: time.Minute,
		Gateway: gateway.Config{MaxColdWaits: 1}})
	url := st.GatewayURL()
	holdWhileCold(t, st, `{"versions": ["v1.0.0"], "tier": "cold", "on_cold": "wait"}`)
	var wg sync.WaitGroup
	wg.Go(func() {
		if status, _, b := chatOnce(t, url, chatBody("mixtral", 4, false), map[string]string{"X-Request-Timeout": "5"}); status != 503 {
			t.Errorf("held request past its deadline: %d %s, want 503", status, b)
		}
	})
	testkit.CheckFor(t, 5*time.Second, 50*time.Millisecond, func() error {
		if metric(st, "switchyard_gateway_cold_waiting_requests", nil) != 1 {
			return errors.New("no request held")
		}
		return nil
	})
	began := time.Now()
	status, _, b := chatOnce(t, url, chatBody("mixtral", 4, false), map[string]string{"X-Request-Timeout": "5"})
	if status != 503 || !strings.Contains(b, "model_loading") {
		t.Errorf("second request: %d %s, want 503 model_loading", status, b)
	}
	// Held, it would have been answered at its 5 s deadline.
	if took := time.Since(began); took > 4*time.Second {
		t.Errorf("the second request was answered after %s: it was held beyond the bound", took)
	}
	if n := metric(st, "switchyard_gateway_cold_waits_total", map[string]string{"outcome": "full"}); n != 1 {
		t.Errorf("cold waits refused for want of a slot = %v, want 1", n)
	}
	wg.Wait()
}
