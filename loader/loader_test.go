package loader_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/loader"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

const mixtral = "mixtral-8x22b"

func coldModel(load, extra string) string {
	return fmt.Sprintf(`{"tier": "cold", "load": %s%s}`, load, extra)
}

func execAction(path string) string {
	b, _ := json.Marshal(map[string][]string{"exec": {path, "{model}", "{version}"}})
	return string(b)
}

func loads(reg *prometheus.Registry, model, outcome string) float64 {
	return testkit.Sum(reg, "switchyard_loader_loads_total", map[string]string{"model": model, "outcome": outcome})
}

// Many requests from two brokers, shared by two loaders, while the model
// loads: one load action, one requested/started/ready, and nothing more
// once a replica is ready.
func TestOneLoadHoweverManyRequests(t *testing.T) {
	path, calls := script(t, "sleep 0.3")
	e := newEnv(t, map[string]string{mixtral: coldModel(execAction(path), "")})
	regA := e.start(loader.Config{ID: "loader-a"})
	regB := e.start(loader.Config{ID: "loader-b"})
	brokerA, brokerB := e, e // two publishers on the same subject, as two brokers are
	for range 5 {
		brokerA.request(mixtral, "v1.0.0", 20)
		brokerB.request(mixtral, "v1.0.0", 20)
	}
	testkit.CheckFor(e.t, 10*time.Second, 20*time.Millisecond, testkit.Cond("the load to start", func() bool { return e.count(mixtral, subjects.LoadStarted) == 1 }))
	// Still loading: more requests start nothing.
	e.request(mixtral, "v1.0.0", 50)
	e.heartbeat("mixtral-0", mixtral, "v1.0.0", subjects.StateLoading, 0)
	e.heartbeat("mixtral-0", mixtral, "v1.0.0", subjects.StateReady, 0)
	testkit.CheckFor(e.t, 10*time.Second, 20*time.Millisecond, testkit.Cond("the load to be ready", func() bool { return e.count(mixtral, subjects.LoadReady) == 1 }))
	e.request(mixtral, "v1.0.0", 50)
	e.heartbeat("mixtral-0", mixtral, "v1.0.0", subjects.StateReady, 0)
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}

	if got := lines(t, calls); len(got) != 1 || got[0] != "load "+mixtral+" v1.0.0" {
		t.Errorf("load action calls = %q, want one \"load %s v1.0.0\"", got, mixtral)
	}
	if got := strings.Join(e.phases(mixtral), ","); got != "requested,started,ready" {
		t.Errorf("phases = %s, want requested,started,ready", got)
	}
	if n := loads(regA, mixtral, "ready") + loads(regB, mixtral, "ready"); n != 1 {
		t.Errorf("loads_total{outcome=ready} over both loaders = %v, want 1", n)
	}
	st, _ := e.last(mixtral, subjects.LoadReady)
	if st.ElapsedMillis < 300 || st.Version != "v1.0.0" {
		t.Errorf("ready status = %+v, want the version and elapsed ≥ the action's 300 ms", st)
	}
}

func TestFailedLoadIsReportedAndRetriedAfterCooldown(t *testing.T) {
	path, calls := script(t, `echo "no GPU free in zone-b" >&2; exit 3`)
	e := newEnv(t, map[string]string{mixtral: coldModel(execAction(path), "")})
	const cooldown = 700 * time.Millisecond
	reg := e.start(loader.Config{ID: "loader-a", Cooldown: cooldown})
	e.request(mixtral, "v1.0.0", 1)
	testkit.CheckFor(e.t, 10*time.Second, 20*time.Millisecond, testkit.Cond("the failure", func() bool { return e.count(mixtral, subjects.LoadFailed) == 1 }))
	st, _ := e.last(mixtral, subjects.LoadFailed)
	if !strings.Contains(st.Error, "no GPU free in zone-b") || st.RetryAfterMillis != cooldown.Milliseconds() {
		t.Errorf("failed status = %+v, want the script's message and the cooldown", st)
	}
	if n := loads(reg, mixtral, "failed"); n != 1 {
		t.Errorf("loads_total{outcome=failed} = %v, want 1", n)
	}
	// Within the cooldown a request is counted and starts nothing.
	failedAt := time.Now()
	e.request(mixtral, "v1.0.0", 1)
	testkit.CheckFor(e.t, 5*time.Second, 20*time.Millisecond, testkit.Cond("the request to be deduplicated", func() bool {
		return deduplicated(reg) >= 1
	}))

	if time.Since(failedAt) < cooldown {
		if got := lines(t, calls); len(got) != 1 {
			t.Fatalf("calls within the cooldown = %q, want 1", got)
		}
	}
	// After it, the next request runs the action again.
	testkit.CheckFor(e.t, 10*time.Second, 20*time.Millisecond, testkit.Cond("a second attempt after the cooldown", func() bool {
		e.request(mixtral, "v1.0.0", 1)
		return len(lines(t, calls)) == 2
	}))
}

func deduplicated(reg *prometheus.Registry) float64 {
	return testkit.Sum(reg, "switchyard_loader_load_requests_deduplicated_total", nil)
}

// A replica that heartbeats while it is up: the test's stand-in for the
// engine the load and unload scripts would start and stop.
type fakeReplica struct {
	e      *env
	id     string
	mu     sync.Mutex
	state  string
	up     bool
	stop   chan struct{}
	done   chan struct{}
	closed sync.Once
}

func startReplica(t *testing.T, e *env, id string) *fakeReplica {
	r := &fakeReplica{e: e, id: id, state: subjects.StateLoading, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-r.stop:
				return
			case <-tick.C:
			}
			r.mu.Lock()
			up, state := r.up, r.state
			r.mu.Unlock()
			if up {
				e.heartbeat(id, mixtral, "v1.0.0", state, 0)
			}
		}
	}()
	t.Cleanup(func() { r.closed.Do(func() { close(r.stop) }); <-r.done })
	return r
}

func (r *fakeReplica) set(up bool, state string) {
	r.mu.Lock()
	r.up, r.state = up, state
	r.mu.Unlock()
}

func TestIdleUnloadDrainsThenTheNextRequestLoadsAgain(t *testing.T) {
	load, calls := script(t, "")
	unload := strings.TrimSuffix(load, "action.sh") + "action.sh" // the same script logs both
	model := coldModel(execAction(load), fmt.Sprintf(`, "idle_unload_after": "400ms", "unload": %s`, execAction(unload)))
	e := newEnv(t, map[string]string{mixtral: model})
	ctx := context.Background()
	reg := e.start(loader.Config{ID: "loader-a", DrainTimeout: 5 * time.Second})
	rep := startReplica(t, e, "mixtral-0")

	for round := 1; round <= 2; round++ {
		e.request(mixtral, "v1.0.0", 3)
		testkit.CheckFor(e.t, 10*time.Second, 20*time.Millisecond, testkit.Cond("the load action", func() bool { return strings.Count(strings.Join(lines(t, calls), "\n"), "load "+mixtral) >= round }))
		// The "engine" comes up: registered and heartbeating ready.
		if _, err := e.kv.Put(ctx, "replicas.mixtral-0", []byte(`{"model": "`+mixtral+`", "version": "v1.0.0", "pool": "general", "state": "ready"}`)); err != nil {
			t.Fatal(err)
		}
		rep.set(true, subjects.StateReady)
		testkit.CheckFor(e.t, 10*time.Second, 20*time.Millisecond, testkit.Cond("ready", func() bool { return e.count(mixtral, subjects.LoadReady) == round }))
		// No request for idle_unload_after: drained first, then unloaded.
		testkit.CheckFor(e.t, 10*time.Second, 20*time.Millisecond, testkit.Cond("the unload to start", func() bool { return e.count(mixtral, subjects.LoadUnloading) == round }))
		testkit.CheckFor(e.t, 10*time.Second, 20*time.Millisecond, testkit.Cond("the replica marked draining", func() bool {
			v, err := e.kv.Get(ctx, "replicas.mixtral-0")
			return err == nil && strings.Contains(string(v.Value()), `"draining"`)
		}))

		testkit.CheckFor(e.t, 10*time.Second, 20*time.Millisecond, testkit.Cond("the unload action", func() bool { return strings.Count(strings.Join(lines(t, calls), "\n"), "unload "+mixtral) == round }))
		rep.set(false, "") // the unload stopped it
		testkit.CheckFor(e.t, 10*time.Second, 20*time.Millisecond, testkit.Cond("unloaded", func() bool { return e.count(mixtral, subjects.LoadUnloaded) == round }))
		if _, err := e.kv.Get(ctx, "replicas.mixtral-0"); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("round %d: the unloaded replica's registration is still there (err %v)", round, err)
		}
	}
	if n := loads(reg, mixtral, "ready"); n != 2 {
		t.Errorf("loads_total{ready} = %v, want 2", n)
	}
}

// A model serving requests is not idle, whatever the time since the load.
func TestBusyModelIsNotUnloaded(t *testing.T) {
	load, calls := script(t, "")
	e := newEnv(t, map[string]string{mixtral: coldModel(execAction(load), `, "idle_unload_after": "200ms", "unload": {"exec": ["/bin/true"]}`)})
	e.start(loader.Config{ID: "loader-a"})
	e.request(mixtral, "v1.0.0", 1)
	testkit.CheckFor(e.t, 10*time.Second, 20*time.Millisecond, testkit.Cond("the load action", func() bool { return len(lines(t, calls)) == 1 }))
	// Five idle periods of heartbeats with three requests running: the
	// poll ends early only if an unload begins.
	_, busy := testkit.Poll(time.Second, 50*time.Millisecond, func() error {
		e.heartbeat("mixtral-0", mixtral, "v1.0.0", subjects.StateReady, 3) // three requests running
		if e.count(mixtral, subjects.LoadUnloading) != 0 {
			return nil
		}
		return errors.New("busy and loaded")
	})
	if busy == nil {
		t.Errorf("a busy model was unloaded (%d unloading statuses)", e.count(mixtral, subjects.LoadUnloading))
	}
}

func TestWebhookAction(t *testing.T) {
	var mu sync.Mutex
	var got []string
	fail := true
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		got = append(got, r.Method+" "+r.URL.Path+" "+string(b))
		if fail {
			fail = false
			http.Error(w, "scheduler busy", http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(srv.Close)
	e := newEnv(t, map[string]string{mixtral: coldModel(`{"webhook": "`+srv.URL+`/models/{model}/load"}`, "")})
	e.start(loader.Config{ID: "loader-a", Cooldown: 100 * time.Millisecond})
	e.request(mixtral, "v1.0.0", 1)
	testkit.CheckFor(e.t, 10*time.Second, 20*time.Millisecond, testkit.Cond("the failed webhook", func() bool { return e.count(mixtral, subjects.LoadFailed) == 1 }))
	st, _ := e.last(mixtral, subjects.LoadFailed)
	if !strings.Contains(st.Error, "503") || !strings.Contains(st.Error, "scheduler busy") {
		t.Errorf("failed status error = %q, want the webhook's status and message", st.Error)
	}
	testkit.CheckFor(e.t, 10*time.Second, 20*time.Millisecond, testkit.Cond("the webhook accepted", func() bool {
		e.request(mixtral, "v1.0.0", 1)
		return e.count(mixtral, subjects.LoadStarted) == 1
	}))

	mu.Lock()
	defer mu.Unlock()
	want := `POST /models/` + mixtral + `/load {"action":"load","model":"` + mixtral + `","version":"v1.0.0"}`
	if len(got) != 2 || got[1] != want {
		t.Errorf("webhook calls = %q, want the second to be %q", got, want)
	}
}

// The Kubernetes action against an API server speaking the scale
// subresource: a merge patch of spec.replicas with the bearer token.
func TestKubernetesScale(t *testing.T) {
	var mu sync.Mutex
	replicas := 0
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		const path = "/apis/apps/v1/namespaces/ml/deployments/mixtral/scale"
		switch {
		case r.Header.Get("Authorization") != "Bearer sa-token":
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, `{"kind":"Status","status":"Failure","message":"Unauthorized","code":401}`)
			return
		case r.URL.Path != path:
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"kind":"Status","status":"Failure","message":"deployments.apps \"x\" not found","code":404}`)
			return
		case r.Method != http.MethodPatch || r.Header.Get("Content-Type") != "application/merge-patch+json":
			w.WriteHeader(http.StatusUnsupportedMediaType)
			return
		}
		var patch struct {
			Spec struct {
				Replicas *int `json:"replicas"`
			} `json:"spec"`
		}
		if err := json.NewDecoder(r.Body).Decode(&patch); err != nil || patch.Spec.Replicas == nil {
			w.WriteHeader(http.StatusUnprocessableEntity)
			return
		}
		mu.Lock()
		replicas = *patch.Spec.Replicas
		n := replicas
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"kind":"Scale","apiVersion":"autoscaling/v1","metadata":{"name":"mixtral","namespace":"ml"},"spec":{"replicas":%d},"status":{"replicas":0}}`, n)
	}))
	t.Cleanup(srv.Close)
	k := &loader.Kubernetes{Server: srv.URL, HTTP: srv.Client(), Token: func() (string, error) { return "sa-token", nil }}
	acts := &loader.Standard{Kubernetes: k}
	ctx := context.Background()
	action := &table.Action{Kubernetes: &table.KubernetesAction{Namespace: "ml", Deployment: "mixtral", Replicas: 2}}
	if err := acts.Run(ctx, loader.Op{Model: mixtral, Action: action}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if replicas != 2 {
		t.Errorf("after load: replicas = %d, want 2", replicas)
	}
	mu.Unlock()
	if err := acts.Run(ctx, loader.Op{Unload: true, Model: mixtral, Action: action}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if replicas != 0 {
		t.Errorf("after unload: replicas = %d, want 0", replicas)
	}
	mu.Unlock()

	wrong := &table.Action{Kubernetes: &table.KubernetesAction{Namespace: "ml", Deployment: "x"}}
	if err := acts.Run(ctx, loader.Op{Model: mixtral, Action: wrong}); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("scaling a missing deployment: err = %v, want the API server's message", err)
	}
	k.Token = func() (string, error) { return "stale", nil }
	if err := acts.Run(ctx, loader.Op{Model: mixtral, Action: action}); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("with a bad token: err = %v, want 401", err)
	}
}

// A load whose action succeeded but whose replica never heartbeats ready
// fails at the load timeout, and says so.
func TestLoadWithoutAReadyReplicaFails(t *testing.T) {
	path, _ := script(t, "")
	e := newEnv(t, map[string]string{mixtral: coldModel(execAction(path), "")})
	reg := e.start(loader.Config{ID: "loader-a", LoadTimeout: 500 * time.Millisecond})
	e.request(mixtral, "v1.0.0", 1)
	e.heartbeat("mixtral-0", mixtral, "v1.0.0", subjects.StateLoading, 0)
	testkit.CheckFor(e.t, 10*time.Second, 20*time.Millisecond, testkit.Cond("the failure", func() bool { return e.count(mixtral, subjects.LoadFailed) == 1 }))
	st, _ := e.last(mixtral, subjects.LoadFailed)
	if !strings.Contains(st.Error, "no replica of "+mixtral+" heartbeat ready within 500ms") || st.ElapsedMillis < 500 {
		t.Errorf("failed status = %+v, want the load timeout", st)
	}
	if got := strings.Join(e.phases(mixtral), ","); got != "requested,started,failed" {
		t.Errorf("phases = %s", got)
	}
	if n := loads(reg, mixtral, "failed"); n != 1 {
		t.Errorf("loads_total{failed} = %v, want 1", n)
	}
}

// runLoader runs a loader until the returned stop is called.
func runLoader(t *testing.T, e *env, cfg loader.Config) (stop func()) {
	t.Helper()
	nc, err := nats.Connect(e.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.IdleCheck = 50 * time.Millisecond
	l, err := loader.New(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	testkit.CheckFor(e.t, 10*time.Second, 20*time.Millisecond, testkit.Cond("the loader subscribed", l.Serving))
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("loader: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the loader did not stop within 10 s")
			}
			nc.Close()
		})
	}
	t.Cleanup(stop)
	return stop
}

// A loader stopped mid-load returns at once and leaves the load to the
// next loader.
func TestStoppedLoaderLeavesTheLoadToTheNext(t *testing.T) {
	path, calls := script(t, "")
	e := newEnv(t, map[string]string{mixtral: coldModel(execAction(path), "")})
	stopA := runLoader(t, e, loader.Config{ID: "loader-a"})
	e.request(mixtral, "v1.0.0", 1)
	testkit.CheckFor(e.t, 10*time.Second, 20*time.Millisecond, testkit.Cond("the load to start", func() bool { return e.count(mixtral, subjects.LoadStarted) == 1 }))
	stopA() // fails the test after 10 s: the load would wait 10 minutes for a heartbeat
	runLoader(t, e, loader.Config{ID: "loader-b"})
	e.request(mixtral, "v1.0.0", 1)
	testkit.CheckFor(e.t, 10*time.Second, 20*time.Millisecond, testkit.Cond("the second loader to run the load", func() bool { return len(lines(t, calls)) == 2 }))
}
