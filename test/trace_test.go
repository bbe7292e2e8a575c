package test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/auth"
	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/subjects"
)

// TestDecisionsCarryTheTrace follows llm.decision.> as `switchyard
// decisions` does: a client's traceparent travels with the request and the
// decision names its trace; without one the gateway starts a trace.
func TestDecisionsCarryTheTrace(t *testing.T) {
	eachDecider(t, func(t *testing.T, decide string) {
		st := startStack(t, devstack.Config{Gateway: gateway.Config{Decide: decide}, Replicas: devstack.ReplicasNamed("l8-gen-0")})
		nc, err := connectAs(st, auth.Role{Kind: auth.RoleObserver})
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		got := make(chan subjects.Decision, 16)
		sub, err := nc.Subscribe("llm.decision.>", func(m *nats.Msg) {
			var d subjects.Decision
			if json.Unmarshal(m.Data, &d) == nil {
				got <- d
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		_ = nc.Flush()

		const trace = "4bf92f3577b34da6a3ce929d0e0e4736"
		body := `{"model":"chat-small","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`
		for _, tp := range []string{"00-" + trace + "-00f067aa0ba902b7-01", ""} {
			req, _ := http.NewRequest("POST", st.GatewayURL()+"/v1/chat/completions", strings.NewReader(body))
			if tp != "" {
				req.Header.Set("traceparent", tp)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			select {
			case d := <-got:
				if tp != "" && d.TraceID != trace {
					t.Errorf("decision trace %q, want %q", d.TraceID, trace)
				}
				if tp == "" && (len(d.TraceID) != 32 || d.TraceID == trace) {
					t.Errorf("without a traceparent the gateway should start a trace; decision has %q", d.TraceID)
				}
				if d.Replica != "l8-gen-0" || d.Reason == "" || d.RequestID == "" {
					t.Errorf("decision lacks its explanation: %+v", d)
				}
			case <-time.After(3 * time.Second):
				t.Fatal("no decision published")
			}
		}
	})
}
