package adapter_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/internal/testkit"
	adapter "github.com/switchyard-llm/switchyard/replica-adapter"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// heartbeats subscribes to a replica's heartbeats.
func heartbeats(t *testing.T, nc *nats.Conn, id string) func() subjects.Heartbeat {
	t.Helper()
	ch := make(chan *nats.Msg, 1024)
	sub, err := nc.ChanSubscribe(subjects.New("").Heartbeat(id), ch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return func() subjects.Heartbeat {
		t.Helper()
		var hb subjects.Heartbeat
		if err := json.Unmarshal(next(t, ch).Data, &hb); err != nil {
			t.Fatal(err)
		}
		return hb
	}
}

// waitHeartbeat reads heartbeats until one satisfies ok, and returns it.
// Each look waits for the next heartbeat, so CheckFor need not sleep.
func waitHeartbeat(t *testing.T, nextHB func() subjects.Heartbeat, ok func(subjects.Heartbeat) error) subjects.Heartbeat {
	t.Helper()
	var hb subjects.Heartbeat
	testkit.CheckFor(t, 5*time.Second, 0, func() error {
		hb = nextHB()
		return ok(hb)
	})
	return hb
}

// TestRegistration checks the replica's KV value: "loading" until /health
// answers 200, then "ready", with the configured fields and the detected
// flavor.
func TestRegistration(t *testing.T) {
	e := newEnv(t)
	e.eng.health.Store(http.StatusServiceUnavailable)
	e.start(e.config())
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		r, err := e.replica("r-1")
		if err != nil {
			return err
		}
		if r.State != subjects.StateLoading {
			return fmt.Errorf("state %q, want loading", r.State)
		}
		return nil
	})

	e.eng.health.Store(http.StatusOK)
	e.waitReady("r-1")
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		got, err := e.replica("r-1")
		if err != nil {
			return err
		}

		want := table.Replica{Model: "sim-model", Version: "v1", Pool: "general", Flavor: adapter.FlavorVLLM, MaxBatch: 32, MaxQueue: 128, State: subjects.StateReady,
			Endpoints: subjects.AllEndpoints()}
		if !reflect.DeepEqual(got, want) {
			return fmt.Errorf("registered %+v, want %+v", got, want)
		}
		return nil
	})

	entry, err := e.kv.Get(context.Background(), "replicas.r-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := table.Decode(entry.Key(), entry.Value()); err != nil {
		t.Errorf("the registration does not pass the table's validation: %v", err)
	}
}

// TestOperatorStateSurvives checks that an operator's draining survives the
// adapter's re-registration: the adapter rewrites its fields, never the state.
func TestOperatorStateSurvives(t *testing.T) {
	e := newEnv(t)
	e.eng.health.Store(http.StatusServiceUnavailable)
	e.start(e.config())
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		_, err := e.replica("r-1")
		return err
	})

	// The operator drains the replica, writing a value of their own.
	if _, err := e.kv.Put(context.Background(), "replicas.r-1", []byte(`{"model":"sim-model","pool":"general","state":"draining"}`)); err != nil {
		t.Fatal(err)
	}
	// The engine becomes healthy: the adapter re-registers as ready…
	e.eng.health.Store(http.StatusOK)
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		r, err := e.replica("r-1")
		if err != nil {
			return err
		}
		if r.MaxBatch != 32 {
			return fmt.Errorf("not re-registered yet: %+v", r)
		}

		if r.State != subjects.StateDraining {
			t.Fatalf("operator's draining replaced by %q", r.State)
		}
		return nil
	})
}

// TestDrain checks the drain on context end: the heartbeat and KV say
// draining, new requests get a 503 rejection, the request in flight
// finishes, then the key is deleted and Run returns.
func TestDrain(t *testing.T) {
	e := newEnv(t)
	release := make(chan struct{})
	e.eng.handle(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte("data: {\"n\":1}\n\n"))
		w.(http.Flusher).Flush()
		if wait(r, release) {
			_, _ = w.Write([]byte("data: [DONE]\n\n"))
		}
	})
	nextHB := heartbeats(t, e.nc, "r-1")
	run := e.start(e.config())
	e.waitReady("r-1")
	inflight := e.request("r-1", chatHeaders("req-long"), `{"model":"x"}`)
	for range 3 {
		next(t, inflight)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- run.stop(t) }()

	waitHeartbeat(t, nextHB, func(hb subjects.Heartbeat) error {
		if hb.State != subjects.StateDraining || hb.Inflight != 1 {
			return fmt.Errorf("state %q inflight %d", hb.State, hb.Inflight)
		}
		return nil
	})
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		r, err := e.replica("r-1")
		if err != nil {
			return err
		}
		if r.State != subjects.StateDraining {
			return fmt.Errorf("KV state %q", r.State)
		}
		return nil
	})

	rejected := untilEnd(t, e.request("r-1", chatHeaders("req-late"), `{"model":"x"}`))
	if len(rejected) != 1 || seq(t, rejected[0]) != 0 || rejected[0].Header.Get(subjects.HdrStatus) != "503" || rejected[0].Header.Get(subjects.HdrRetryAfter) == "" ||
		rejected[0].Header.Get(subjects.HdrRouteReplica) != "r-1" { // the gateway retries elsewhere only when a replica is named
		t.Errorf("want a single 503 rejection with Retry-After, got %d messages: %v", len(rejected), rejected[0].Header)
	}
	select {
	case err := <-stopped:
		t.Fatalf("Run returned (%v) with a request in flight", err)
	default:
	}

	close(release)
	rest := untilEnd(t, inflight)
	if end := rest[len(rest)-1]; end.Header.Get(subjects.HdrError) != "" {
		t.Errorf("the in-flight request ended with an error: %v", end.Header)
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after the drain")
	}
	if _, err := e.kv.Get(context.Background(), "replicas.r-1"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("key after the drain: %v, want deleted", err)
	}
	if n := len(e.eng.requests()); n != 1 {
		t.Errorf("the engine saw %d requests, want 1", n)
	}
}

// TestDrainGrace checks that requests still running when the grace ends are
// cancelled, end with Llm-Error, and Run returns.
func TestDrainGrace(t *testing.T) {
	e := newEnv(t)
	e.eng.handle(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte("data: {}\n\n"))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	cfg := e.config()
	cfg.DrainGrace = 50 * time.Millisecond
	run := e.start(cfg)
	e.waitReady("r-1")
	ch := e.request("r-1", chatHeaders("req-stuck"), `{"model":"x"}`)
	for range 3 {
		next(t, ch)
	}
	if err := run.stop(t); err != nil {
		t.Errorf("Run: %v", err)
	}
	msgs := untilEnd(t, ch)
	if got := msgs[len(msgs)-1].Header.Get(subjects.HdrError); got == "" {
		t.Error("a request cut by the drain ended without Llm-Error")
	}
	if n := run.a.InFlight(); n != 0 {
		t.Errorf("in flight %d after Run returned", n)
	}
}

// TestHeartbeat checks the heartbeat's load fields from the engine's metrics,
// its sequence, and scrape_ok turning false after ScrapeFailLimit failures.
func TestHeartbeat(t *testing.T) {
	e := newEnv(t)
	nextHB := heartbeats(t, e.nc, "r-1")
	e.start(e.config())
	hb := waitHeartbeat(t, nextHB, func(hb subjects.Heartbeat) error {
		if !hb.ScrapeOK || hb.State != subjects.StateReady {
			return fmt.Errorf("scrape_ok %v state %q", hb.ScrapeOK, hb.State)
		}
		return nil
	})
	if hb.KVUsage != 0.00146484375 || hb.Running != 6 || hb.Waiting != 0 || hb.MaxBatch != 32 || hb.MaxQueue != 128 {
		t.Errorf("load fields %+v", hb)
	}
	// The capture's newest lora_requests_info series tie; nothing waits.
	if want := (subjects.LoraState{Running: []string{"lora-a", "lora-b"}, Waiting: []string{}, Max: 2}); !reflect.DeepEqual(hb.Lora, want) {
		t.Errorf("lora %+v, want %+v", hb.Lora, want)
	}
	if hb.Replica != "r-1" || hb.Model != "sim-model" || hb.Version != "v1" || hb.Pool != "general" || hb.SentUnixMillis == 0 {
		t.Errorf("identity fields %+v", hb)
	}
	if later := nextHB(); later.Seq <= hb.Seq {
		t.Errorf("seq %d after %d", later.Seq, hb.Seq)
	}

	e.eng.metrics.Store("") // /metrics now answers 500
	waitHeartbeat(t, nextHB, func(hb subjects.Heartbeat) error {
		if hb.ScrapeOK {
			return errNotYet
		}
		return nil
	})
	e.eng.metrics.Store("vllm/metrics-idle.txt")
	hb = waitHeartbeat(t, nextHB, func(hb subjects.Heartbeat) error {
		if !hb.ScrapeOK {
			return errNotYet
		}
		return nil
	})
	if hb.Running != 0 || len(hb.Lora.Running) != 0 {
		t.Errorf("after recovery %+v", hb)
	}
}

// TestHeartbeatFlavors checks the engines without a KV metric: llama.cpp's
// busy slots and TGI's batch fill stand in for it.
func TestHeartbeatFlavors(t *testing.T) {
	tests := []struct {
		flavor, metrics, slots string
		running, waiting       int
		kv                     float64
	}{
		{adapter.FlavorLlamaCpp, "llamacpp/metrics-from-source.txt", "llamacpp/slots-docs-example.json", 3, 2, 1},
		{adapter.FlavorLlamaCpp, "llamacpp/metrics-from-source.txt", "", 3, 2, 3.0 / 32},
		{adapter.FlavorTGI, "tgi/metrics-from-source.txt", "", 21, 4, 21.0 / 32},
		{adapter.FlavorSGLang, "sglang/metrics-from-source.txt", "", 12, 3, 0.3699415312370517},
	}
	for _, tt := range tests {
		t.Run(tt.metrics+"/slots="+tt.slots, func(t *testing.T) {
			e := newEnv(t)
			e.eng.metrics.Store(tt.metrics)
			e.eng.slots.Store(tt.slots)
			nextHB := heartbeats(t, e.nc, "r-1")
			e.start(e.config())
			hb := waitHeartbeat(t, nextHB, func(hb subjects.Heartbeat) error {
				if !hb.ScrapeOK {
					return errNotYet
				}
				return nil
			})
			if hb.Running != tt.running || hb.Waiting != tt.waiting || hb.KVUsage != tt.kv {
				t.Errorf("heartbeat running %d waiting %d kv %v, want %d %d %v", hb.Running, hb.Waiting, hb.KVUsage, tt.running, tt.waiting, tt.kv)
			}
			e.waitReady("r-1")
			if r, _ := e.replica("r-1"); r.Flavor != tt.flavor {
				t.Errorf("registered flavor %q, want %q", r.Flavor, tt.flavor)
			}
		})
	}
}

// TestDiscoveryAndMetrics checks the micro service's identity (its
// metadata names its region, which the deciders time their pings by) and
// the adapter's Prometheus series.
func TestDiscoveryAndMetrics(t *testing.T) {
	e := newEnv(t)
	e.eng.handle(streamSSE(t))
	reg := prometheus.NewRegistry()
	cfg := e.config()
	cfg.Registerer = reg
	cfg.Region = "eu-west"
	e.start(cfg)
	e.waitReady("r-1")

	resp, err := e.nc.Request("$SRV.INFO."+subjects.AdapterService, nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var info micro.Info
	if err := json.Unmarshal(resp.Data, &info); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"replica": "r-1", "model": "sim-model", "version": "v1", "pool": "general", "flavor": "vllm", "region": "eu-west"} {
		if info.Metadata[k] != want {
			t.Errorf("metadata %s = %q, want %q", k, info.Metadata[k], want)
		}
	}
	subjectsSeen := map[string]string{}
	for _, ep := range info.Endpoints {
		subjectsSeen[ep.Name] = ep.Subject
		if ep.QueueGroup != "" {
			t.Errorf("endpoint %s in queue group %q", ep.Name, ep.QueueGroup)
		}
	}
	if subjectsSeen["request"] != "llm.replica.r-1" || subjectsSeen["cancel"] != "llm.replica.r-1.cancel" {
		t.Errorf("endpoints %v", subjectsSeen)
	}

	untilEnd(t, e.request("r-1", chatHeaders("req-m"), `{"model":"x"}`))
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		got := gather(t, reg)
		for name, want := range map[string]float64{
			`switchyard_adapter_engine_requests_total{replica="r-1",status="200"}`: 1,
			`switchyard_adapter_engine_errors_total{replica="r-1"}`:                0,
			`switchyard_adapter_inflight{replica="r-1"}`:                           0,
			`switchyard_adapter_scrape_failures_total{replica="r-1"}`:              0,
		} {
			if v, ok := got[name]; !ok || v != want {
				return fmt.Errorf("%s = %v (present %v), want %v", name, v, ok, want)
			}
		}
		if got[`switchyard_adapter_heartbeat_seq{replica="r-1"}`] < 1 {
			return errors.New("heartbeat_seq not set")
		}
		return nil
	})
}

// gather flattens a registry into "name{labels}" → value.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			key := f.GetName() + "{"
			for i, l := range m.GetLabel() {
				if i > 0 {
					key += ","
				}
				key += l.GetName() + `="` + l.GetValue() + `"`
			}
			key += "}"
			switch {
			case m.Counter != nil:
				out[key] = m.Counter.GetValue()
			case m.Gauge != nil:
				out[key] = m.Gauge.GetValue()
			}
		}
	}
	return out
}

func TestNewValidates(t *testing.T) {
	e := newEnv(t)
	good := e.config()
	for name, mutate := range map[string]func(*adapter.Config){
		"replica with a dot": func(c *adapter.Config) { c.Replica = "r.1" },
		"empty replica":      func(c *adapter.Config) { c.Replica = "" },
		"no model":           func(c *adapter.Config) { c.Model = "" },
		"model with colon":   func(c *adapter.Config) { c.Model = "m:lora" },
		"unknown flavor":     func(c *adapter.Config) { c.Flavor = "triton" },
		"no engine URL":      func(c *adapter.Config) { c.EngineURL = "" },
		"engine URL scheme":  func(c *adapter.Config) { c.EngineURL = "ftp://x" },
		"pool with a space":  func(c *adapter.Config) { c.Pool = "a b" },
		"unknown pd role":    func(c *adapter.Config) { c.Role = "encode" },
		"unknown scheduling": func(c *adapter.Config) { c.EngineScheduling = "lottery" },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := good
			mutate(&cfg)
			if _, err := adapter.New(e.nc, cfg); !errors.Is(err, adapter.ErrConfig) {
				t.Errorf("New: %v, want ErrConfig", err)
			}
		})
	}
	if _, err := adapter.New(e.nc, good); err != nil {
		t.Errorf("good config: %v", err)
	}
}

// TestHeartbeatSaysPriorityScheduling: an adapter declared in front of an
// engine that schedules by priority says so to brokers; one in front of a
// first-come-first-served engine says nothing.
func TestHeartbeatSaysPriorityScheduling(t *testing.T) {
	for _, c := range []struct{ scheduling, want string }{
		{adapter.SchedulingPriority, subjects.SchedulingPriority},
		{"", ""},
	} {
		e := newEnv(t)
		nextHB := heartbeats(t, e.nc, "r-1")
		cfg := e.config()
		cfg.EngineScheduling = c.scheduling
		e.start(cfg)
		waitHeartbeat(t, nextHB, func(hb subjects.Heartbeat) error {
			if hb.Scheduling != c.want {
				return fmt.Errorf("scheduling %q, want %q", hb.Scheduling, c.want)
			}
			return nil
		})
	}
}

// An engine busy streaming can be too slow to answer a scrape in time: as
// long as its streams flow it is not down, and the heartbeat keeps saying
// scrape_ok. Once nothing flows, the same slow scrapes turn it false.
func TestSlowScrapeWhileStreamingIsNotAFailure(t *testing.T) {
	e := newEnv(t)
	nextHB := heartbeats(t, e.nc, "r-1")
	cfg := e.config()
	cfg.ScrapeEvery, cfg.ScrapeFailLimit = 100*time.Millisecond, 2
	e.start(cfg)
	waitHeartbeat(t, nextHB, func(hb subjects.Heartbeat) error {
		if !hb.ScrapeOK {
			return errNotYet
		}
		return nil
	})
	release := make(chan struct{})
	e.eng.handle(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-release:
				_, _ = io.WriteString(w, "data: [DONE]\n\n")
				return
			case <-r.Context().Done():
				return
			case <-tick.C:
				_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n")
				w.(http.Flusher).Flush()
			}
		}
	})
	replies := e.request("r-1", chatHeaders("slow-scrape"), `{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	next(t, replies) // the accept
	e.eng.stall.Store(int64(1500 * time.Millisecond))
	// Scrapes time out after 1s; three in a row would be past the limit.
	until := time.Now().Add(3500 * time.Millisecond)
	for time.Now().Before(until) {
		if hb := nextHB(); !hb.ScrapeOK {
			t.Fatalf("scrape_ok false while the engine streamed: %+v", hb)
		}
	}
	close(release)
	untilEnd(t, replies)
	deadline := time.Now().Add(10 * time.Second)
	for nextHB().ScrapeOK {
		if time.Now().After(deadline) {
			t.Fatal("scrape_ok still true 10s after the engine stopped streaming and answering scrapes")
		}
	}
}
