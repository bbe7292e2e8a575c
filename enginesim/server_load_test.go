package enginesim_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/switchyard-llm/switchyard/enginesim"
	"github.com/switchyard-llm/switchyard/internal/sse"
	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// scrape reads the simulator's /metrics the way Prometheus does.
func scrape(t *testing.T, hs *httptest.Server) map[string]*dto.MetricFamily {
	t.Helper()
	return testkit.Scrape(t, hs.URL+"/metrics")
}

// gauge returns the value of a single-series gauge.
func gauge(t *testing.T, fams map[string]*dto.MetricFamily, name string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok || len(f.GetMetric()) != 1 {
		t.Fatalf("metric %s missing or not a single series", name)
	}
	return f.GetMetric()[0].GetGauge().GetValue()
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// openStream starts a streamed chat and returns once the response headers
// (and, with waitToken, the first token) have arrived. Closing the body
// hangs up on the server.
func openStream(t *testing.T, ctx context.Context, hs *httptest.Server, model string, waitToken bool) *http.Response {
	t.Helper()
	body := `{"model":"` + model + `","stream":true,"max_tokens":1000,"messages":[{"role":"user","content":"tell me a long story"}]}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/v1/chat/completions", strings.NewReader(body))
	resp, err := hs.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != 200 {
		t.Fatalf("stream status %d", resp.StatusCode)
	}
	if waitToken {
		if l, err := sse.NewReader(resp.Body, 64<<10).Next(); err != nil || l.Field != "data" {
			t.Fatalf("first line %+v: %v", l, err)
		}
	}
	return resp
}

func TestMetricsReflectInFlight(t *testing.T) {
	srv, hs := start(t, enginesim.ServerConfig{
		Engine:   enginesim.Config{Model: "sim-model", ITL: 20 * time.Millisecond, MaxLoras: 2},
		Adapters: []string{"lora-a"},
	})
	ctx := context.Background()
	streams := []*http.Response{
		openStream(t, ctx, hs, "sim-model", true),
		openStream(t, ctx, hs, "sim-model", true),
		openStream(t, ctx, hs, "lora-a", true),
	}
	fams := scrape(t, hs)
	if got := gauge(t, fams, "vllm:num_requests_running"); got != 3 {
		t.Errorf("running = %v, want 3", got)
	}
	if got := gauge(t, fams, "vllm:num_requests_waiting"); got != 0 {
		t.Errorf("waiting = %v, want 0", got)
	}
	if got := gauge(t, fams, "vllm:kv_cache_usage_perc"); got <= 0 || got >= 1 {
		t.Errorf("kv usage = %v, want in (0, 1)", got)
	}
	lora := fams["vllm:lora_requests_info"].GetMetric()
	if len(lora) != 1 {
		t.Fatalf("lora_requests_info has %d series, want 1", len(lora))
	}
	l := labels(lora[0])
	if l["running_lora_adapters"] != "lora-a" || l["waiting_lora_adapters"] != "" || l["max_lora"] != "2" {
		t.Errorf("lora labels %v", l)
	}
	if ts := lora[0].GetGauge().GetValue(); time.Since(time.Unix(int64(ts), 0)) > time.Minute {
		t.Errorf("lora_requests_info value %v is not a current timestamp", ts)
	}
	if srv.InFlight() != 3 {
		t.Errorf("InFlight = %d, want 3", srv.InFlight())
	}

	for _, s := range streams {
		s.Body.Close()
	}
	testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, testkit.Cond("in-flight requests to be cancelled", func() bool { return srv.InFlight() == 0 }))
	testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, testkit.Cond("metrics to show an idle engine", func() bool {
		f := scrape(t, hs)
		return gauge(t, f, "vllm:num_requests_running") == 0 && gauge(t, f, "vllm:kv_cache_usage_perc") == 0
	}))
}

func TestMetricsMatchVLLMNamesTypesAndLabels(t *testing.T) {
	_, hs := start(t, enginesim.ServerConfig{Engine: enginesim.Config{Model: "sim-model"}, Adapters: []string{"lora-a"}, Speed: 10})
	post(t, hs, "/v1/chat/completions", fmtBody(chatBody, `,"max_tokens":3`))
	// The engine loop publishes its counters after the answer is written,
	// as vLLM's does, and not all at once: wait for the whole request to
	// show (at least its 3 tokens; more fails below).
	var ours map[string]*dto.MetricFamily
	testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		ours = scrape(t, hs)
		if g := ours["vllm:generation_tokens_total"]; g == nil || g.GetMetric()[0].GetCounter().GetValue() < 3 {
			return errors.New("the request's tokens are not all counted yet")
		}
		return nil
	})
	vllm := testkit.ParseMetrics(t, bytes.NewReader(golden(t, "metrics-idle.txt")))
	for _, name := range []string{
		"vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:lora_requests_info",
		"vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds",
		"vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds", "vllm:request_success_total",
		"vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vllm:cache_config_info",
	} {
		o, v := ours[name], vllm[name]
		if o == nil || v == nil {
			t.Errorf("%s: ours %v, vLLM's %v", name, o != nil, v != nil)
			continue
		}
		if o.GetType() != v.GetType() {
			t.Errorf("%s: type %v, vLLM has %v", name, o.GetType(), v.GetType())
		}
		ol, vl := labelNames(o), labelNames(v)
		if !slices.Equal(ol, vl) {
			t.Errorf("%s: labels %v, vLLM has %v", name, ol, vl)
		}
	}
	if got := ours["vllm:generation_tokens_total"].GetMetric()[0].GetCounter().GetValue(); got != 3 {
		t.Errorf("generation tokens = %v, want 3", got)
	}
	if got := ours["vllm:time_to_first_token_seconds"].GetMetric()[0].GetHistogram().GetSampleCount(); got != 1 {
		t.Errorf("TTFT samples = %v, want 1", got)
	}
}

func labelNames(f *dto.MetricFamily) []string {
	var out []string
	for k := range labels(f.GetMetric()[0]) {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func TestDisconnectCancelsRequest(t *testing.T) {
	srv, hs := start(t, enginesim.ServerConfig{Engine: enginesim.Config{ITL: 20 * time.Millisecond}})

	t.Run("stream", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		openStream(t, ctx, hs, "sim-model", true)
		if srv.InFlight() != 1 {
			t.Fatalf("InFlight = %d, want 1", srv.InFlight())
		}
		cancel()
		testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, testkit.Cond("the engine to drop the request", func() bool { return srv.InFlight() == 0 }))
	})

	t.Run("non-stream", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() {
			body := `{"model":"sim-model","max_tokens":1000,"messages":[{"role":"user","content":"x"}]}`
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL+"/v1/chat/completions", strings.NewReader(body))
			if resp, err := hs.Client().Do(req); err == nil {
				resp.Body.Close()
				t.Error("request finished instead of being cancelled")
			}
		})
		testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, testkit.Cond("the request to reach the engine", func() bool { return srv.InFlight() == 1 }))
		cancel()
		wg.Wait()
		testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, testkit.Cond("the engine to drop the request", func() bool { return srv.InFlight() == 0 }))
	})
	f := scrape(t, hs)
	if gauge(t, f, "vllm:num_requests_running") != 0 {
		t.Error("engine still reports running requests")
	}
}

func TestQueueFullRejectsWith503(t *testing.T) {
	_, hs := start(t, enginesim.ServerConfig{Engine: enginesim.Config{MaxBatch: 1, MaxQueue: 1, ITL: 20 * time.Millisecond}})
	ctx := context.Background()
	openStream(t, ctx, hs, "sim-model", true)  // runs
	openStream(t, ctx, hs, "sim-model", false) // waits
	resp := post(t, hs, "/v1/chat/completions", fmtBody(chatBody, ""))
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("status %d Retry-After %q, want 503 and 1", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if e := readJSON(t, resp.Body)["error"].(map[string]any); e["code"] != 503.0 {
		t.Errorf("error %v, want code 503", e)
	}
	f := scrape(t, hs)
	if gauge(t, f, "vllm:num_requests_running") != 1 || gauge(t, f, "vllm:num_requests_waiting") != 1 {
		t.Error("want 1 running and 1 waiting")
	}
}

func TestFixedMode(t *testing.T) {
	srv, hs := start(t, enginesim.ServerConfig{
		Engine: enginesim.Config{TTFTBase: 40 * time.Millisecond, ITL: 2 * time.Millisecond, MaxBatch: 1},
		Fixed:  true,
	})
	// With MaxBatch 1 the model would serialize these; fixed mode does not.
	var wg sync.WaitGroup
	began := time.Now()
	for range 6 {
		wg.Go(func() {
			resp, err := hs.Client().Post(hs.URL+"/v1/chat/completions", "application/json",
				strings.NewReader(fmtBody(chatBody, `,"max_tokens":10`)))
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("status %d", resp.StatusCode)
			}
		})
	}
	wg.Wait()
	if d := time.Since(began); d < 58*time.Millisecond || d > 2*time.Second {
		t.Errorf("6 concurrent requests took %v, want about one request's 58ms", d)
	}
	openStream(t, context.Background(), hs, "sim-model", true)
	f := scrape(t, hs)
	if gauge(t, f, "vllm:num_requests_running") != 1 || gauge(t, f, "vllm:kv_cache_usage_perc") == 0 {
		t.Error("fixed mode should still report its in-flight load")
	}
	if srv.InFlight() != 1 {
		t.Errorf("InFlight = %d, want 1", srv.InFlight())
	}
}

func TestSpeedScalesTime(t *testing.T) {
	_, hs := start(t, enginesim.ServerConfig{
		Engine: enginesim.Config{TTFTBase: time.Second, ITL: 100 * time.Millisecond},
		Speed:  20,
	})
	began := time.Now()
	resp := post(t, hs, "/v1/chat/completions", fmtBody(chatBody, `,"max_tokens":3`))
	readJSON(t, resp.Body)
	// 1.2 s of engine time at 20× is 60 ms.
	if d := time.Since(began); d < 55*time.Millisecond || d > 600*time.Millisecond {
		t.Errorf("request took %v, want about 60ms", d)
	}
}

func TestServeStopsWithOpenStreams(t *testing.T) {
	srv := enginesim.NewServer(enginesim.ServerConfig{Engine: enginesim.Config{ITL: 20 * time.Millisecond}})
	ln := testkit.Listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()

	body := `{"model":"sim-model","stream":true,"max_tokens":1000,"messages":[{"role":"user","content":"x"}]}`
	resp, err := http.Post("http://"+ln.Addr().String()+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, testkit.Cond("the stream to start", func() bool { return srv.InFlight() == 1 }))
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return")
	}
	events := streamData(t, resp.Body)
	if len(events) == 0 || events[len(events)-1] == "[DONE]" || !strings.Contains(events[len(events)-1], `"error"`) {
		t.Errorf("a stream cut by shutdown must end with an error event, not [DONE]; last events %q", events[max(0, len(events)-2):])
	}
	if srv.InFlight() != 0 {
		t.Errorf("InFlight = %d after shutdown", srv.InFlight())
	}
	http.DefaultClient.CloseIdleConnections()
}
