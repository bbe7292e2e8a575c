package adapter

import (
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/subjects"
)

// TestClientPriorityNeverReachesTheEngine: the priority an engine that
// schedules by priority gets is the router's (batch work behind every
// interactive request), whatever the body says, even written twice; an
// FCFS engine gets 0 where a client wrote one, which it accepts, and
// nothing where none was written.
func TestClientPriorityNeverReachesTheEngine(t *testing.T) {
	read := func(t *testing.T, a *Adapter, priority, endpoint, body string) (json.RawMessage, bool) {
		t.Helper()
		h := nats.Header{subjects.HdrEndpoint: {endpoint}}
		if priority != "" {
			h.Set(subjects.HdrPriority, priority)
		}
		req, e := engineRequest(a, h, []byte(body))
		if e != nil {
			t.Fatal(e)
		}
		var m map[string]json.RawMessage
		if err := json.NewDecoder(req.Body).Decode(&m); err != nil {
			t.Fatal(err)
		}
		v, ok := m["priority"]
		return v, ok
	}
	bodies := []string{
		`{"model":"m","messages":[]}`,
		`{"model":"m","messages":[],"priority":-1000000}`,
		`{"priority":-5,"model":"m","messages":[],"priority":-5}`,
	}
	byPriority := &Adapter{cfg: Config{EngineURL: "http://engine:8000", EngineModel: "served", EngineScheduling: SchedulingPriority}}
	for _, c := range []struct{ header, want string }{
		{subjects.PriorityBatch, "1"},
		{subjects.PriorityInteractive, "0"},
		{"", "0"},
	} {
		for _, endpoint := range []string{subjects.EndpointChat, subjects.EndpointCompletions, subjects.EndpointEmbeddings} {
			for _, body := range bodies {
				if got, _ := read(t, byPriority, c.header, endpoint, body); string(got) != c.want {
					t.Errorf("priority engine, Llm-Priority %q, %s %s: the engine got priority %s, want %s", c.header, endpoint, body, got, c.want)
				}
			}
		}
	}
	fcfs := &Adapter{cfg: Config{EngineURL: "http://engine:8000", EngineModel: "served", EngineScheduling: SchedulingFCFS}}
	for _, body := range bodies {
		got, has := read(t, fcfs, subjects.PriorityBatch, subjects.EndpointChat, body)
		switch {
		case body == bodies[0] && has:
			t.Errorf("fcfs engine: priority %s added to a body without one", got)
		case body != bodies[0] && string(got) != "0":
			t.Errorf("fcfs engine, %s: the engine got priority %s, want 0", body, got)
		}
	}
}

// TestPrefillLegCarriesTheRoutersPriority: a split request's prefill leg is
// an engine call too, and gets the same priority as the request.
func TestPrefillLegCarriesTheRoutersPriority(t *testing.T) {
	a := &Adapter{cfg: Config{EngineScheduling: SchedulingPriority}}
	h := nats.Header{subjects.HdrPriority: {subjects.PriorityBatch}}
	b, e := prefillBody([]byte(`{"model":"m","priority":-9,"messages":[]}`), "served", true, a.priorityField(h))
	if e != nil {
		t.Fatal(e)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if string(m["priority"]) != "1" {
		t.Errorf("the prefill leg's priority is %s, want 1", m["priority"])
	}
}
