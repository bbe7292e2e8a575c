package test

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/devstack"
)

// TestEnginesGetTheRoutersPriority: through the whole stack, an engine that
// schedules by priority gets each request's priority from the router (0
// interactive, 1 batch), never the one the client wrote into the body; an
// engine that schedules first come first served gets 0 where the client
// wrote another, and answers instead of refusing it.
func TestEnginesGetTheRoutersPriority(t *testing.T) {
	send := func(t *testing.T, st *devstack.Stack, priority string) {
		t.Helper()
		body := `{"model":"chat-small","max_tokens":2,"priority":-100,"messages":[{"role":"user","content":"me first"}]}`
		req, err := http.NewRequest(http.MethodPost, st.GatewayURL()+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer sk-default-dev")
		req.Header.Set("Content-Type", "application/json")
		if priority != "" {
			req.Header.Set("X-Priority", priority)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("X-Priority %q: %d %s", priority, resp.StatusCode, b)
		}
	}
	t.Run("priority", func(t *testing.T) {
		st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed("l8-gen-0")})
		send(t, st, "")
		send(t, st, "interactive")
		send(t, st, "batch")
		if got, want := st.Engine("l8-gen-0").Priorities(), []int64{0, 0, 1}; !slices.Equal(got, want) {
			t.Errorf("the engine got priorities %v, want %v", got, want)
		}
		// A batch's lines, whatever their bodies say.
		var lines strings.Builder
		for i := range 3 {
			fmt.Fprintf(&lines, `{"custom_id":"p-%d","method":"POST","url":"/v1/chat/completions","body":{"model":"chat-small","max_tokens":2,"priority":-5,"messages":[{"role":"user","content":"line %d"}]}}`+"\n", i, i)
		}
		c := client(st, "sk-default-dev")
		b := awaitBatch(t, c, runBatch(t, c, lines.String()).ID, time.Minute)
		if b.Status != "completed" || b.RequestCounts.Completed != 3 {
			t.Fatalf("the batch: %s %+v", b.Status, b.RequestCounts)
		}
		if got, want := st.Engine("l8-gen-0").Priorities()[3:], []int64{1, 1, 1}; !slices.Equal(got, want) {
			t.Errorf("the engine got the batch lines' priorities %v, want %v", got, want)
		}
	})
	t.Run("fcfs", func(t *testing.T) {
		st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed("l8-gen-0"), FCFSEngines: true})
		send(t, st, "batch")
		if got, want := st.Engine("l8-gen-0").Priorities(), []int64{0}; !slices.Equal(got, want) {
			t.Errorf("the engine got priorities %v, want %v", got, want)
		}
	})
}
