package policy_test

import (
	"encoding/json"
	"maps"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/broker/policy"
	examples "github.com/switchyard-llm/switchyard/deploy/examples"
	"github.com/switchyard-llm/switchyard/devstack/fleet"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// devReplicas registers the replicas `switchyard dev` runs, as their
// adapters do.
func devReplicas(t testing.TB) []byte {
	t.Helper()
	flat := map[string]table.Replica{}
	for _, r := range fleet.Dev() {
		flat["replicas."+r.ID] = r.Registration()
	}
	b, err := json.Marshal(flat)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// build decodes flat tables (later ones override keys of earlier ones) into
// a snapshot through table.Decode and Snapshot.Set, as the KV watcher does.
// A null value deletes the key.
func build(t testing.TB, flats ...[]byte) *table.Snapshot {
	t.Helper()
	all := map[string]json.RawMessage{}
	for _, f := range flats {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(f, &m); err != nil {
			t.Fatalf("table literal: %v", err)
		}
		maps.Copy(all, m)
	}
	s := table.NewSnapshot()
	s.Revision = 42
	for k, v := range all {
		if string(v) == "null" {
			continue
		}
		val, err := table.Decode(k, v)
		if err != nil {
			t.Fatalf("decode %s: %v", k, err)
		}
		s.Set(val, v)
	}
	return s
}

// env is a Router on a table, a clock and a seeded rng.
type env struct {
	t   testing.TB
	r   *policy.Router
	now time.Time
	rng *rand.Rand
}

// newEnv builds the dev table plus extra keys, with every registered
// replica heartbeating idle at t0.
func newEnv(t testing.TB, extra ...string) *env {
	t.Helper()
	flats := [][]byte{examples.Table(), devReplicas(t)}
	for _, x := range extra {
		flats = append(flats, []byte(x))
	}
	s := build(t, flats...)
	e := &env{t: t, r: policy.New(policy.Config{Self: "b1"}), now: t0, rng: rand.New(rand.NewPCG(1, 2))}
	e.r.SetTable(s)
	for id := range s.Replicas {
		e.beat(id, 0.1, 0, 0)
	}
	return e
}

// retable swaps in the dev table plus extra keys; heartbeats already
// received are kept, new replicas have none.
func (e *env) retable(extra ...string) {
	e.t.Helper()
	flats := [][]byte{examples.Table(), devReplicas(e.t)}
	for _, x := range extra {
		flats = append(flats, []byte(x))
	}
	e.r.SetTable(build(e.t, flats...))
}

// beat sends a ready heartbeat for id with the given load, as of e.now.
func (e *env) beat(id string, kv float64, running, waiting int, mods ...func(*subjects.Heartbeat)) {
	reg := e.r.Table().Replicas[id]
	hb := &subjects.Heartbeat{Replica: id, State: subjects.StateReady, KVUsage: kv, Running: running, Waiting: waiting,
		MaxBatch: 32, MaxQueue: 128, ScrapeOK: true, TTFTEWMAMillis: 50, QueueWaitMillis: 10}
	if reg != nil {
		hb.Model, hb.Version, hb.Pool, hb.Lora.Max = reg.Model, reg.Version, reg.Pool, reg.MaxLoras
	}
	for _, m := range mods {
		m(hb)
	}
	e.r.ObserveHeartbeat(hb, e.now)
}

func (e *env) decide(q *policy.Request) *policy.Decision {
	d := new(policy.Decision)
	*d = e.r.Decide(q, e.now, e.rng)
	return d
}

func (e *env) explain(q *policy.Request) *policy.Decision {
	d := new(policy.Decision)
	*d = e.r.Explain(q, e.now, e.rng)
	return d
}

// mustRoute fails unless the decision was admitted.
func mustRoute(t testing.TB, d *policy.Decision) {
	t.Helper()
	if d.Err != nil {
		t.Fatalf("rejected: %v (reason %s)", d.Err, d.Reason)
	}
	if d.Replica == "" {
		t.Fatal("admitted without a replica")
	}
}

// mustReject fails unless the decision was rejected with status and code.
func mustReject(t testing.TB, d *policy.Decision, status int, code string) {
	t.Helper()
	if d.Err == nil {
		t.Fatalf("admitted to %s (%s), want %d %s", d.Replica, d.Reason, status, code)
	}
	if d.Err.Status != status || d.Err.Code != code {
		t.Fatalf("rejected %d %s (%s), want %d %s", d.Err.Status, d.Err.Code, d.Err.Message, status, code)
	}
	if d.Reason != code {
		t.Fatalf("reason %q, want the code %q", d.Reason, code)
	}
}

func chat(model string) *policy.Request {
	return &policy.Request{Tenant: "default", Model: model, Endpoint: subjects.EndpointChat, PromptTokens: 100}
}
