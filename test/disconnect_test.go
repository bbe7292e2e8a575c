package test

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// rawRequest is a whole HTTP/1.1 request for /v1/chat/completions.
func rawRequest(body string) string {
	return "POST /v1/chat/completions HTTP/1.1\r\nHost: switchyard\r\nContent-Type: application/json\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// longBody is a request for a long generation with a prompt of about
// 12 KB, so the gateway spends a little while reading and parsing it.
func longBody(stream bool) string {
	return `{"model":"chat-small","max_tokens":4000,"stream":` + strconv.FormatBool(stream) +
		`,"messages":[{"role":"user","content":"` + strings.Repeat("tell me a long story. ", 550) + `"}]}`
}

// inFlight is the number of generations running on the stack's engines.
func inFlight(st *devstack.Stack, ids []string) int {
	n := 0
	for _, id := range ids {
		n += st.Engine(id).InFlight()
	}
	return n
}

// TestClientGoneBeforeTheFirstByteCancelsTheGeneration closes the
// connection 0, 1, 2, 5 and 10 ms after a complete body, streamed and not,
// 20 times each: every time the engines' in-flight count is back to 0
// within a second (a generation left running would take 20 s), and the
// gateway counts each disconnect. A client gone before publishing is never
// published; one gone after is cancelled where the broker routed it.
func TestClientGoneBeforeTheFirstByteCancelsTheGeneration(t *testing.T) {
	replicas := devstack.ReplicasNamed("l8-gen-0", "l8-gen-1")
	st := startStack(t, devstack.Config{Replicas: replicas, Speed: 1})
	var ids []string
	for _, r := range replicas {
		ids = append(ids, r.ID)
	}
	published, engineCalls := watchRequests(t, st, ids...)
	addr := strings.TrimPrefix(st.GatewayURL(), "http://")
	const name = "switchyard_gateway_client_disconnects_total"
	counted := metric(st, name, nil)
	for _, stream := range []bool{false, true} {
		req := rawRequest(longBody(stream))
		for _, delay := range []time.Duration{0, time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond, 10 * time.Millisecond} {
			p0, e0 := published.Load(), engineCalls()
			t.Run(fmt.Sprintf("stream=%v/after=%v", stream, delay), func(t *testing.T) {
				var slowest time.Duration
				for range 20 {
					conn, err := net.Dial("tcp", addr)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := conn.Write([]byte(req)); err != nil {
						t.Fatal(err)
					}
					time.Sleep(delay)
					conn.Close()
					counted++
					took := testkit.CheckFor(t, time.Second, 10*time.Millisecond, func() error {
						if n := inFlight(st, ids); n != 0 {
							return fmt.Errorf("%d generation(s) still running for a client that left", n)
						}
						if n := metric(st, name, nil); n != counted {
							return fmt.Errorf("%s = %v, want %v", name, n, counted)
						}
						return nil
					})

					slowest = max(slowest, took)
				}
				t.Logf("in flight back to 0 and the disconnect counted within %v at worst; %d of 20 published, %d reached an engine",
					slowest.Round(time.Millisecond), published.Load()-p0, engineCalls()-e0)
			})
		}
	}
	// A generation that started after its last check would still run now.
	testkit.CheckFor(t, time.Second, 10*time.Millisecond, func() error {
		if n := inFlight(st, ids); n != 0 {
			return fmt.Errorf("%d generation(s) still running", n)
		}
		return nil
	})
}

// watchRequests counts the requests published to the replicas (each
// replica's llm.replica.<id>, seen as its adapter sees them, whichever part
// decided) and the engine calls the adapters made.
func watchRequests(t *testing.T, st *devstack.Stack, replicas ...string) (*atomic.Int64, func() int64) {
	t.Helper()
	var published atomic.Int64
	for _, r := range replicas {
		nc := mustConnectAs(t, st, adapterRole(r))
		if _, err := nc.Subscribe("llm.replica."+r, func(*nats.Msg) { published.Add(1) }); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	return &published, func() int64 { return int64(metric(st, "switchyard_adapter_engine_requests_total", nil)) }
}

// TestClientGoneMidBodyIsNeverPublished closes the connection with half the
// body sent: no request reaches NATS, so no engine ever sees it.
func TestClientGoneMidBodyIsNeverPublished(t *testing.T) {
	replicas := devstack.ReplicasNamed("l8-gen-0")
	st := startStack(t, devstack.Config{Replicas: replicas, Speed: 1})
	published, _ := watchRequests(t, st, replicas[0].ID)
	addr := strings.TrimPrefix(st.GatewayURL(), "http://")
	const name = "switchyard_gateway_client_disconnects_total"
	counted := metric(st, name, nil)
	for _, stream := range []bool{false, true} {
		req := rawRequest(longBody(stream))
		for _, delay := range []time.Duration{0, time.Millisecond, 5 * time.Millisecond} {
			for range 20 {
				conn, err := net.Dial("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := conn.Write([]byte(req[:len(req)/2])); err != nil {
					t.Fatal(err)
				}
				time.Sleep(delay)
				conn.Close()
				counted++
				testkit.CheckFor(t, time.Second, 10*time.Millisecond, func() error {
					if n := metric(st, name, nil); n != counted {
						return fmt.Errorf("%s = %v, want %v", name, n, counted)
					}
					return nil
				})

			}
		}
	}
	if n := published.Load(); n != 0 {
		t.Errorf("%d requests cut mid-body were published", n)
	}
	if n := st.Engine(replicas[0].ID).InFlight(); n != 0 {
		t.Errorf("the engine runs %d requests nobody finished sending", n)
	}
	// The same request sent whole is published: the test can see one.
	if o := send(t.Context(), st.GatewayURL(), chatBody("chat-small", 2, false)); o.status != 200 {
		t.Fatalf("a whole request: %v", o)
	}
	if n := published.Load(); n == 0 {
		t.Error("a whole request was not seen on its replica's subject: the check above cannot fail")
	}
}
