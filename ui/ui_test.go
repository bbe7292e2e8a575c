package ui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/internal/sse"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
	"github.com/switchyard-llm/switchyard/table/kv"
	"github.com/switchyard-llm/switchyard/ui"
)

// state mirrors the pushed JSON, as the page reads it.
type state struct {
	Full   bool `json:"full"`
	Models []struct {
		Model string `json:"model"`
		Pools []struct {
			Pool     string `json:"pool"`
			Replicas []struct {
				ID         string  `json:"id"`
				Role       string  `json:"role"`
				Region     string  `json:"region"`
				State      string  `json:"state"`
				Registered bool    `json:"registered"`
				Heartbeat  bool    `json:"heartbeat"`
				KVUsage    float64 `json:"kv_usage"`
				Waiting    int     `json:"waiting"`
				Release    float64 `json:"release_threshold"`
				WaitMs     float64 `json:"wait_ms"`
				Failures   int     `json:"engine_failures"`
				Until      int64   `json:"ejected_until_unix_ms"`
			} `json:"replicas"`
		} `json:"pools"`
	} `json:"models"`
	Decisions []struct {
		Seq uint64 `json:"seq"`
		subjects.Decision
	} `json:"decisions"`
	Loads []struct {
		Model      string `json:"model"`
		Phase      string `json:"phase"`
		Error      string `json:"error"`
		ElapsedMs  int64  `json:"elapsed_ms"`
		ExpectedMs int64  `json:"expected_ms"`
	} `json:"loads"`
	Seen  uint64 `json:"decisions_seen"`
	Table *struct {
		Revision uint64 `json:"revision"`
		Keys     []struct {
			Key string `json:"key"`
		} `json:"keys"`
		APIKeys int `json:"api_keys"`
	} `json:"table"`
}

// rig is a dashboard on a real nats-server, served by an httptest server.
type rig struct {
	nc     *nats.Conn
	ui     *ui.UI
	srv    *httptest.Server
	cancel context.CancelFunc
	done   chan error
}

func newRig(t *testing.T, cfg ui.Config) (*rig, string) {
	t.Helper()
	ns, url := natstest.Start(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	before := ns.NumSubscriptions()
	cfg.Interval = 20 * time.Millisecond
	r := &rig{nc: nc, ui: ui.New(nc, cfg), done: make(chan error, 1)}
	mux := http.NewServeMux()
	for p, h := range r.ui.Mounts() {
		mux.Handle(p, h)
	}
	r.srv = httptest.NewServer(mux)
	t.Cleanup(r.srv.Close)
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- r.ui.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	// Messages published before Run subscribed would be lost: wait for its
	// heartbeat, decision, ejection, load status and KV-cache update
	// subscriptions to reach the server.
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, testkit.Cond("the dashboard's subscriptions", func() bool { return ns.NumSubscriptions() >= before+5 }))
	return r, url
}

func (r *rig) stop(t *testing.T) {
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	if err := <-r.done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

func (r *rig) publish(t *testing.T, subject string, v any) {
	t.Helper()
	b, _ := json.Marshal(v)
	if err := r.nc.Publish(subject, b); err != nil {
		t.Fatal(err)
	}
}

// events reads "state" events from /ui/events on a goroutine owned by the test.
type events struct {
	ch   chan state
	body io.Closer
	wg   sync.WaitGroup
}

func openEvents(t *testing.T, base string) *events {
	t.Helper()
	resp, err := http.Get(base + "/ui/events")
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); !sse.IsEventStream(ct) {
		t.Fatalf("Content-Type %q", ct)
	}
	e := &events{ch: make(chan state, 64), body: resp.Body}
	e.wg.Go(func() {
		defer close(e.ch)
		r := sse.NewReader(resp.Body, 1<<20)
		for {
			l, err := r.Next()
			if err != nil {
				return
			}
			if l.Field != "data" {
				continue
			}
			var s state
			if err := json.Unmarshal(l.Value, &s); err != nil {
				t.Errorf("bad event %q: %v", l.Value, err)
				return
			}
			e.ch <- s
		}
	})
	t.Cleanup(func() { e.body.Close(); e.wg.Wait() })
	return e
}

// next returns the first event that satisfies ok, failing after 5s.
func (e *events) next(t *testing.T, what string, ok func(state) bool) state {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case s, open := <-e.ch:
			if !open {
				t.Fatalf("stream ended waiting for %s", what)
			}
			if ok(s) {
				return s
			}
		case <-timeout:
			t.Fatalf("no event with %s within 5s", what)
		}
	}
}

// testKeyHash is an API key's hash the dashboard must never show.
const testKeyHash = "eb62f102b47160ce1588bde4fd8784c43f691ab45303f6efe78e1e772065d72e"

func devSnapshot(t *testing.T) *table.Snapshot {
	t.Helper()
	flat := map[string]json.RawMessage{
		"replicas.r-gen-1":    json.RawMessage(`{"model":"m-a","version":"v1","pool":"general","state":"ready"}`),
		"replicas.r-gen-0":    json.RawMessage(`{"model":"m-a","version":"v1","pool":"general","state":"draining"}`),
		"replicas.r-can-0":    json.RawMessage(`{"model":"m-a","version":"v2","pool":"canary","state":"ready"}`),
		"replicas.r-b-0":      json.RawMessage(`{"model":"m-b","version":"v1","pool":"general","state":"ready"}`),
		"pools.canary":        json.RawMessage(`{"affinity_release_threshold":0.5}`),
		"aliases.chat-test":   json.RawMessage(`{"targets":[{"model":"m-a","version":"v1","weight":100}]}`),
		"keys." + testKeyHash: json.RawMessage(`{"tenant":"acme"}`),
	}
	s, errs := table.FromFlat(flat)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	s.Revision = 7
	return s
}

func TestPageIsServedFromTheBinary(t *testing.T) {
	snap := devSnapshot(t)
	r, _ := newRig(t, ui.Config{Table: func() *table.Snapshot { return snap }})
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Get(r.srv.URL + "/ui")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "/ui/" {
		t.Errorf("/ui: %d to %q, want a redirect to /ui/", resp.StatusCode, resp.Header.Get("Location"))
	}
	for path, want := range map[string]string{
		"/ui/":          "<title>Switchyard</title>",
		"/ui/app.js":    "new EventSource('events')",
		"/ui/style.css": "--mono",
	} {
		resp, err := http.Get(r.srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), want) {
			t.Errorf("%s: %d, body lacks %q", path, resp.StatusCode, want)
		}
		if strings.Contains(string(b), "http://") || strings.Contains(string(b), "https://") {
			t.Errorf("%s refers to another origin; the page must work offline", path)
		}
	}
}

func TestEventsPushHeartbeatsDecisionsAndTheTable(t *testing.T) {
	var snap atomic.Pointer[table.Snapshot]
	snap.Store(devSnapshot(t))
	r, _ := newRig(t, ui.Config{Table: snap.Load})
	ev := openEvents(t, r.srv.URL)

	first := ev.next(t, "the full state", func(s state) bool { return s.Full })
	if first.Table == nil || first.Table.Revision != 7 || len(first.Table.Keys) != 6 {
		t.Fatalf("full state table = %+v, want revision 7 with 6 keys", first.Table)
	}
	// API keys are counted, never shown: not the entry, not the hash.
	if first.Table.APIKeys != 1 {
		t.Errorf("api_keys = %d, want 1", first.Table.APIKeys)
	}
	for _, k := range first.Table.Keys {
		if strings.HasPrefix(k.Key, "keys.") || strings.Contains(k.Key, testKeyHash) {
			t.Errorf("the dashboard shows API key %s", k.Key)
		}
	}
	// Grouped by model, then pool, then id.
	var got []string
	for _, m := range first.Models {
		for _, p := range m.Pools {
			for _, rep := range p.Replicas {
				got = append(got, m.Model+"/"+p.Pool+"/"+rep.ID)
			}
		}
	}
	want := "m-a/canary/r-can-0 m-a/general/r-gen-0 m-a/general/r-gen-1 m-b/general/r-b-0"
	if strings.Join(got, " ") != want {
		t.Errorf("replicas %v, want %s", got, want)
	}

	subj := subjects.New("")
	r.publish(t, subj.Heartbeat("r-gen-0"), subjects.Heartbeat{
		Replica: "r-gen-0", Model: "m-a", Pool: "general", State: subjects.StateReady,
		KVUsage: 0.42, Waiting: 3, MaxBatch: 32, MaxQueue: 128,
	})
	s := ev.next(t, "r-gen-0's heartbeat", func(s state) bool {
		return !s.Full && len(s.Models) > 0 && s.Models[0].Pools[1].Replicas[0].Heartbeat
	})
	rep := s.Models[0].Pools[1].Replicas[0]
	if rep.KVUsage != 0.42 || rep.Waiting != 3 || rep.State != subjects.StateDraining || !rep.Registered {
		t.Errorf("r-gen-0 = %+v; want kv 0.42, 3 waiting, draining (the table's state is more restrictive)", rep)
	}
	if s.Table != nil {
		t.Errorf("a push without a new revision carries the table again")
	}
	if got := s.Models[0].Pools[0].Replicas[0].Release; got != 0.5 {
		t.Errorf("canary release threshold %v, want the pool override 0.5", got)
	}

	d := subjects.Decision{Tenant: "acme", Requested: "chat-test", Model: "m-a", Pool: "general", Replica: "r-gen-1",
		Reason: "power-of-two", Alternatives: []subjects.Alternative{{Replica: "r-gen-0", Why: "higher load_score"}}}
	r.publish(t, subj.Decision("general"), d)
	s = ev.next(t, "the decision", func(s state) bool { return len(s.Decisions) > 0 })
	if len(s.Decisions) != 1 || s.Decisions[0].Replica != "r-gen-1" || s.Decisions[0].Seq != 1 ||
		s.Decisions[0].Alternatives[0].Why != "higher load_score" || s.Seen != 1 {
		t.Errorf("decisions pushed %+v, seen %d; want the one decision with seq 1", s.Decisions, s.Seen)
	}

	next := snap.Load().Clone()
	next.Revision = 8
	snap.Store(next)
	ev.next(t, "the new revision", func(s state) bool { return s.Table != nil && s.Table.Revision == 8 })
}

// TestReplicaRoles: the dashboard shows what each replica serves of a
// disaggregated model, as registered (both when the registration says
// nothing), and nothing for a replica known only from its heartbeat; the
// page has a column for it.
func TestReplicaRoles(t *testing.T) {
	snap := devSnapshot(t)
	for id, v := range map[string]string{
		"replicas.pd-p0": `{"model":"m-pd","version":"v1","pool":"general","state":"ready","role":"prefill"}`,
		"replicas.pd-d0": `{"model":"m-pd","version":"v1","pool":"general","state":"ready","role":"decode"}`,
		"replicas.pd-b0": `{"model":"m-pd","version":"v1","pool":"general","state":"ready","role":"both"}`,
	} {
		e, err := table.Decode(id, []byte(v))
		if err != nil {
			t.Fatal(err)
		}
		snap.Set(e, []byte(v))
	}
	r, _ := newRig(t, ui.Config{Table: func() *table.Snapshot { return snap }})
	ev := openEvents(t, r.srv.URL)
	ev.next(t, "the full state", func(s state) bool { return s.Full })
	r.publish(t, subjects.New("").Heartbeat("pd-x0"), subjects.Heartbeat{Replica: "pd-x0", Model: "m-pd", Pool: "general", Region: "eu", State: subjects.StateReady})
	s := ev.next(t, "pd-x0's heartbeat", func(s state) bool {
		for _, m := range s.Models {
			if m.Model == "m-pd" && len(m.Pools) > 0 && len(m.Pools[0].Replicas) == 4 {
				return true
			}
		}
		return false
	})
	got, regions := map[string]string{}, map[string]string{}
	for _, m := range s.Models {
		for _, p := range m.Pools {
			for _, rep := range p.Replicas {
				got[rep.ID], regions[rep.ID] = rep.Role, rep.Region
			}
		}
	}
	if regions["pd-x0"] != "eu" || regions["pd-p0"] != "" {
		t.Errorf("regions pushed %v, want pd-x0's heartbeat's eu and none for the others", regions)
	}
	// The same from the state a script reads once.
	resp, err := http.Get(r.srv.URL + "/ui/state")
	if err != nil {
		t.Fatal(err)
	}
	var once state
	err = json.NewDecoder(resp.Body).Decode(&once)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	fromState := map[string]string{}
	for _, m := range once.Models {
		for _, p := range m.Pools {
			for _, rep := range p.Replicas {
				fromState[rep.ID] = rep.Role
			}
		}
	}
	for id, want := range map[string]string{"pd-p0": "prefill", "pd-d0": "decode", "pd-b0": "both", "r-gen-0": "both", "pd-x0": ""} {
		if got[id] != want {
			t.Errorf("%s role %q pushed, want %q", id, got[id], want)
		}
		if fromState[id] != want {
			t.Errorf("%s role %q in /ui/state, want %q", id, fromState[id], want)
		}
	}
	resp, err = http.Get(r.srv.URL + "/ui/app.js")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"'version', 'role', 'state'", "roleCell(r)", "r.role", "'region'", "r.region"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the page does not show roles: app.js lacks %q", want)
		}
	}
}

// TestEjectedReplicaAndWaitEstimate: the dashboard shows the wait a broker
// estimates for each replica, and a replica a broker ejected for its engine
// failures, until the ejection ends.
func TestEjectedReplicaAndWaitEstimate(t *testing.T) {
	var snap atomic.Pointer[table.Snapshot]
	snap.Store(devSnapshot(t))
	r, _ := newRig(t, ui.Config{Table: snap.Load})
	ev := openEvents(t, r.srv.URL)
	ev.next(t, "the full state", func(s state) bool { return s.Full })
	subj := subjects.New("")
	r.publish(t, subj.Heartbeat("r-gen-1"), subjects.Heartbeat{
		Replica: "r-gen-1", Model: "m-a", Pool: "general", State: subjects.StateReady,
		TTFTEWMAMillis: 180, QueueWaitMillis: 950, EngineFailures: 7,
	})
	until := time.Now().Add(time.Minute).UnixMilli()
	r.publish(t, subj.Eject("r-gen-1"), subjects.Ejection{Replica: "r-gen-1", Broker: "b1", Failures: 5, Count: 1, UntilUnixMs: until})
	s := ev.next(t, "r-gen-1 ejected", func(s state) bool {
		return len(s.Models) > 0 && s.Models[0].Pools[1].Replicas[1].Until != 0
	})
	rep := s.Models[0].Pools[1].Replicas[1]
	if rep.ID != "r-gen-1" || rep.Until != until || rep.Failures != 7 || rep.WaitMs != 950 {
		t.Fatalf("r-gen-1 = %+v; want ejected until %d, 7 failures, a 950 ms wait", rep, until)
	}
}

func TestDecisionsKeepOnlyTheNewest(t *testing.T) {
	r, _ := newRig(t, ui.Config{Table: func() *table.Snapshot { return nil }, MaxDecisions: 3})
	for i := range 5 {
		r.publish(t, subjects.New("").Decision("general"), subjects.Decision{Replica: "r", RequestID: string(rune('a' + i))})
	}
	var s state
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		resp, err := http.Get(r.srv.URL + "/ui/state")
		if err != nil {
			t.Fatal(err)
		}
		s = state{}
		_ = json.NewDecoder(resp.Body).Decode(&s)
		resp.Body.Close()
		if s.Seen < 5 {
			return fmt.Errorf("saw %d decisions, want 5", s.Seen)
		}
		return nil
	})
	var ids []string
	for _, d := range s.Decisions {
		ids = append(ids, d.RequestID)
	}
	if strings.Join(ids, "") != "edc" {
		t.Errorf("kept %v, want the newest three, newest first", ids)
	}
}

func TestWatchesTheBucketWithoutATableFunc(t *testing.T) {
	_, url := natstest.Start(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := kv.EnsureBucket(ctx, js, "ui-test", 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Put(ctx, "replicas.r-0", []byte(`{"model":"m","pool":"general","state":"ready"}`)); err != nil {
		t.Fatal(err)
	}
	u := ui.New(nc, ui.Config{Bucket: "ui-test", Interval: 20 * time.Millisecond})
	srv := httptest.NewServer(u.Handler())
	defer srv.Close()
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- u.Run(runCtx) }()
	defer func() { stop(); <-done }()
	ev := openEvents(t, srv.URL)
	ev.next(t, "the bucket's replica", func(s state) bool {
		return s.Table != nil && len(s.Table.Keys) == 1 && len(s.Models) == 1 && s.Models[0].Pools[0].Replicas[0].ID == "r-0"
	})
}

func TestStoppingEndsEveryStreamAndLeavesNoGoroutines(t *testing.T) {
	// Registered first, so it runs after every other cleanup has stopped
	// the server and the connections.
	testkit.NoGoroutinesLeft(t)
	snap := devSnapshot(t)
	r, _ := newRig(t, ui.Config{Table: func() *table.Snapshot { return snap }})
	ev := openEvents(t, r.srv.URL)
	ev.next(t, "the full state", func(s state) bool { return s.Full })
	r.stop(t)
	for range ev.ch {
	}
	resp, err := http.Get(r.srv.URL + "/ui/events")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("events after stop: %d, want 503", resp.StatusCode)
	}
	r.srv.Close()
	r.nc.Close()
}

// Each cold model's latest load status is on the dashboard.
func TestLoadStatusIsPushed(t *testing.T) {
	r, _ := newRig(t, ui.Config{Table: func() *table.Snapshot { return devSnapshot(t) }})
	ev := openEvents(t, r.srv.URL)
	ev.next(t, "the first full state", func(s state) bool { return s.Full })
	subj := subjects.New("")
	r.publish(t, subj.ControlLoadStatus(), subjects.LoadStatus{Model: "mixtral-8x22b", Phase: subjects.LoadStarted, ExpectedMillis: 20000})
	r.publish(t, subj.ControlLoadStatus(), subjects.LoadStatus{Model: "mixtral-8x22b", Phase: subjects.LoadReady, ElapsedMillis: 20400})
	r.publish(t, subj.ControlLoadStatus(), subjects.LoadStatus{Model: "dbrx", Phase: subjects.LoadFailed, Error: "no GPU"})
	s := ev.next(t, "both models' loads", func(s state) bool {
		return len(s.Loads) == 2 && s.Loads[1].Phase == subjects.LoadReady
	})
	if l := s.Loads[0]; l.Model != "dbrx" || l.Error != "no GPU" {
		t.Errorf("loads[0] = %+v, want dbrx failed with its error", l)
	}
	if l := s.Loads[1]; l.Model != "mixtral-8x22b" || l.ElapsedMs != 20400 {
		t.Errorf("loads[1] = %+v, want mixtral-8x22b ready after 20.4 s", l)
	}
}
