package decider

import (
	"encoding/json"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchyard-llm/switchyard/deploy/examples"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/table"
)

// A new replica's heartbeats that come before its registration are
// counted, not warned of; a replica that stays unregistered past the grace
// is warned of once, by name, whatever its messages.
func TestUnregisteredReplicaWarnedOnlyPastTheGrace(t *testing.T) {
	_, url := natstest.Start(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	t0 := time.Date(2026, 12, 3, 17, 0, 0, 0, time.UTC)
	var now atomic.Int64
	now.Store(t0.UnixNano())
	at := func(d time.Duration) { now.Store(t0.Add(d).UnixNano()) }
	var logs testkit.SyncBuffer
	b, err := New(nc, Config{ID: "t", Now: func() time.Time { return time.Unix(0, now.Load()) },
		Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	flat := examples.Flat()
	snap, errs := table.FromFlat(flat)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	b.SetTable(snap)

	heartbeat := func(id string) {
		b.onHeartbeat(&nats.Msg{Subject: "llm.heartbeat." + id,
			Data: []byte(`{"replica":"` + id + `","model":"llama-3-70b-instruct","state":"ready","scrape_ok":true}`)})
	}
	refused := func() float64 { return testutil.ToFloat64(b.metrics.refused.WithLabelValues(refusedReplica)) }
	warnings := func() []map[string]any {
		var out []map[string]any
		for line := range strings.SplitSeq(logs.String(), "\n") {
			var r map[string]any
			if json.Unmarshal([]byte(line), &r) == nil && r["level"] == "WARN" {
				out = append(out, r)
			}
		}
		return out
	}

	// new-0 heartbeats for two seconds before its registration arrives.
	for s := range 3 {
		at(time.Duration(s) * time.Second)
		heartbeat("new-0")
	}
	if got := refused(); got != 3 {
		t.Errorf("refused %v heartbeats before the registration, want 3", got)
	}
	reg, err := table.Decode("replicas.new-0", []byte(`{"model":"llama-3-70b-instruct","version":"v1.5.0","pool":"general","max_batch":32,"max_queue":128,"state":"ready"}`))
	if err != nil {
		t.Fatal(err)
	}
	snap = snap.Clone()
	snap.Set(reg, nil)
	b.SetTable(snap)
	at(3 * time.Second)
	heartbeat("new-0")
	if got := refused(); got != 3 {
		t.Errorf("refused %v heartbeats after the registration, want still 3", got)
	}
	if w := warnings(); len(w) != 0 {
		t.Errorf("a replica registered within the grace was warned of: %v", w)
	}

	// ghost-0 never registers: warned of once it has been refused for
	// longer than the grace, and only once.
	for s := range 30 {
		at(10*time.Second + time.Duration(s)*time.Second)
		heartbeat("ghost-0")
		if w := warnings(); s <= int(unregisteredGrace/time.Second) && len(w) != 0 {
			t.Fatalf("warned after %d s of refusals: %v", s, w)
		}
	}
	w := warnings()
	if len(w) != 1 {
		t.Fatalf("%d warnings of a replica unregistered for 30 s, want 1: %v", len(w), w)
	}
	if w[0]["replica"] != "ghost-0" || !strings.HasPrefix(w[0]["msg"].(string), "heartbeat of a replica not registered") {
		t.Errorf("warning %v, want one naming ghost-0's heartbeats", w[0])
	}
}

// Refusals further apart than the grace are separate waits: a replica
// deregistered long after an earlier wait starts a new one.
func TestUnregisteredRunsEndAtAGap(t *testing.T) {
	var u unregistered
	t0 := time.Date(2026, 12, 3, 17, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		after time.Duration
		late  bool
	}{
		{0, false},
		{unregisteredGrace, false},
		{unregisteredGrace + time.Second, true},
		{10 * unregisteredGrace, false}, // a gap: a new wait
		{11 * unregisteredGrace, false},
	} {
		if _, late := u.late("r", t0.Add(c.after)); late != c.late {
			t.Errorf("refused at +%v: late %v, want %v", c.after, late, c.late)
		}
	}
	for i := range maxUnregisteredTracked - 1 {
		u.late("x-"+string(rune('a'+i%26))+time.Duration(i).String(), t0)
	}
	if _, late := u.late("one-too-many", t0); !late {
		t.Error("a refusal past maxUnregisteredTracked replicas is not warned of at once")
	}
}
