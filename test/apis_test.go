package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// apiReplicas are the two chat-small replicas, which serve every endpoint,
// and the coder replica, which serves no Responses API.
func apiReplicas() []devstack.Replica {
	all := devstack.Replicas()
	return []devstack.Replica{all[6], all[7], all[8]}
}

type apiAnswer struct {
	status  int
	replica string
	reason  string
	body    map[string]any
}

func (a apiAnswer) code() string {
	e, _ := a.body["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

func call(t *testing.T, method, url, body string) apiAnswer {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := apiAnswer{status: resp.StatusCode, replica: resp.Header.Get("X-Switchyard-Replica"), reason: resp.Header.Get("X-Switchyard-Reason")}
	if err := json.Unmarshal(b, &a.body); err != nil {
		t.Fatalf("%s %s: %d %q is not JSON", method, url, resp.StatusCode, b)
	}
	return a
}

// A conversation over stored responses stays on the replica holding them,
// with no conversation id; when that replica drains, the next turn is a
// clear 404, counted, never an answer without the conversation.
func TestStoredResponsesStayOnTheirReplica(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: apiReplicas(), HeartbeatEvery: 100 * time.Millisecond, ScrapeEvery: 100 * time.Millisecond})
	url := st.GatewayURL()
	turn := func(prev string) apiAnswer {
		body := `{"model":"chat-small","input":"Tell me more","max_output_tokens":4`
		if prev != "" {
			body += `,"previous_response_id":"` + prev + `"`
		}
		return call(t, "POST", url+"/v1/responses", body+"}")
	}
	first := turn("")
	if first.status != 200 {
		t.Fatalf("first turn: %d %v", first.status, first.body)
	}
	owner, prev := first.replica, first.body["id"].(string)
	var inputTokens float64
	for i := 2; i <= 3; i++ {
		a := turn(prev)
		if a.status != 200 || a.replica != owner || a.reason != "response-affinity" {
			t.Fatalf("turn %d: %d on %s (%s), want 200 on %s by response-affinity: %v", i, a.status, a.replica, a.reason, owner, a.body)
		}
		in := a.body["usage"].(map[string]any)["input_tokens"].(float64)
		if in <= inputTokens {
			t.Errorf("turn %d: input_tokens %v, want the stored conversation counted (more than %v)", i, in, inputTokens)
		}
		inputTokens, prev = in, a.body["id"].(string)
	}
	if g := call(t, "GET", url+"/v1/responses/"+prev, ""); g.status != 200 || g.replica != owner || g.body["id"] != prev {
		t.Errorf("GET the last response: %d from %s, want 200 from %s: %v", g.status, g.replica, owner, g.body)
	}
	first2 := first.body["id"].(string)
	if d := call(t, "DELETE", url+"/v1/responses/"+first2, ""); d.status != 200 || d.replica != owner || d.body["deleted"] != true {
		t.Errorf("DELETE the first response: %d from %s: %v", d.status, d.replica, d.body)
	}
	if g := call(t, "GET", url+"/v1/responses/"+first2, ""); g.status != 404 || g.code() != subjects.CodePreviousResponseNotFound {
		t.Errorf("GET a deleted response: %d %v, want 404 %s", g.status, g.body, subjects.CodePreviousResponseNotFound)
	}

	drainInTable(t, st, owner)

	before := metric(st, "switchyard_broker_rejections_total", map[string]string{"code": subjects.CodePreviousResponseNotFound})
	if a := turn(prev); a.status != 404 || a.code() != subjects.CodePreviousResponseNotFound {
		t.Errorf("a turn whose replica drains: %d %v, want 404 %s", a.status, a.body, subjects.CodePreviousResponseNotFound)
	}
	if n := metric(st, "switchyard_broker_rejections_total", map[string]string{"code": subjects.CodePreviousResponseNotFound}); n != before+1 {
		t.Errorf("rejections{code=previous_response_not_found} went from %v to %v, want one more", before, n)
	}
	if a := turn("resp_unknown"); a.status != 404 || a.code() != subjects.CodePreviousResponseNotFound {
		t.Errorf("an unknown previous response: %d %v", a.status, a.body)
	}
}

// A model none of whose replicas serves an endpoint is a 501, not a 404
// from an engine that lacks it; its other endpoints still work.
func TestEndpointNotServedIs501(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: apiReplicas()})
	url := st.GatewayURL()
	a := call(t, "POST", url+"/v1/responses", `{"model":"qwen-coder-32b","input":"x","max_output_tokens":2}`)
	if a.status != 501 || a.code() != subjects.CodeEndpointNotSupported {
		t.Errorf("responses on a model without it: %d %v, want 501 %s", a.status, a.body, subjects.CodeEndpointNotSupported)
	}
	m := call(t, "POST", url+"/v1/messages", `{"model":"qwen-coder-32b","max_tokens":2,"messages":[{"role":"user","content":"x"}]}`)
	if m.status != 200 || m.body["type"] != "message" || m.replica != "coder-gen-0" {
		t.Errorf("messages on the same model: %d from %s: %v", m.status, m.replica, m.body)
	}
	// The Anthropic SDKs send the key as x-api-key: team-x's key gets its adapter.
	req, _ := http.NewRequest("POST", url+"/v1/messages", strings.NewReader(`{"model":"chat-small","max_tokens":2,"messages":[{"role":"user","content":"x"}]}`))
	req.Header.Set("x-api-key", "sk-teamx-dev")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("X-Switchyard-Lora") != "team-x-v3" {
		t.Errorf("x-api-key of team-x: %d, lora %q, want team-x-v3", resp.StatusCode, resp.Header.Get("X-Switchyard-Lora"))
	}
	e := call(t, "POST", url+"/v1/messages", `{"model":"nope","max_tokens":2,"messages":[{"role":"user","content":"x"}]}`)
	if inner, _ := e.body["error"].(map[string]any); e.status != 404 || e.body["type"] != "error" || inner["type"] != "not_found_error" {
		t.Errorf("messages for an unknown model: %d %v, want 404 in Anthropic's shape", e.status, e.body)
	}
}

// drainInTable sets replica id draining in its replicas.<id> key, as an
// operator does, and waits until the broker sees it.
func drainInTable(t *testing.T, st *devstack.Stack, id string) {
	t.Helper()
	bucket, ctx := kvBucket(t, st), context.Background()
	e, err := bucket.Get(ctx, "replicas."+id)
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	_ = json.Unmarshal(e.Value(), &v)
	v["state"] = subjects.StateDraining
	if _, err := bucket.Update(ctx, "replicas."+id, jsonMarshal(v), e.Revision()); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if s := replicaState(st, id); s != subjects.StateDraining {
			return fmt.Errorf("broker sees %q", s)
		}
		return nil
	})
}
