package test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// TestEngineRejectionIsRetriedOnAnotherReplica: an engine answering 429
// or 503 before the first byte is retried on the other replica with
// Llm-Exclude, and after a streak of such answers its replica is ejected,
// so it stops drawing requests at all; with every engine refusing, the panic
// threshold ejects nothing and the client gets an explicit error, after at
// most two retries each.
func TestEngineRejectionIsRetriedOnAnotherReplica(t *testing.T) {
	for _, status := range []int{429, 503} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			// Through the one broker: the ejection gauges read below are
			// each decider's own, and a gateway that decides is one more.
			st := startStack(t, devstack.Config{Replicas: l8(), Gateway: gateway.Config{Decide: gateway.DecideBroker}})
			url := st.GatewayURL()
			f0, f1 := st.Faults("l8-gen-0"), st.Faults("l8-gen-1")
			f0.SetReject(status)
			for i := range 40 {
				o := send(context.Background(), url, chatBody("chat-small", 2, i%2 == 0))
				if o.status != 200 || !o.done || o.replica != "l8-gen-1" {
					t.Errorf("engine l8-gen-0 answering %d: %v", status, o)
				}
			}
			rejected := f0.Rejected()
			retries := metric(st, "switchyard_gateway_retries_total", nil)
			if rejected == 0 || retries != float64(rejected) {
				t.Errorf("engine %d: %d rejections, %v retries; want one retry per rejection", status, rejected, retries)
			}
			// The adapter heartbeats the streak at once; a request or two
			// may pass it on the way.
			if ej := metric(st, "switchyard_broker_ejections_total", map[string]string{"replica": "l8-gen-0"}); ej < 1 || rejected > subjects.EjectAfterFailures+2 {
				t.Errorf("engine %d: %d requests reached it, %v ejections; want ejection after %d", status, rejected, ej, subjects.EjectAfterFailures)
			}
			t.Logf("engine answering %d: 40 of 40 requests served, %d reached the failing engine before its replica was ejected", status, rejected)

			f1.SetReject(503)
			for range 12 {
				o := send(context.Background(), url, chatBody("chat-small", 2, false))
				if o.status != 503 || o.code == "" {
					t.Errorf("every engine refusing: %v; want an explicit 503", o)
				}
			}
			if ej := metric(st, "switchyard_broker_ejected_replicas", nil); ej != 2 {
				t.Errorf("ejected replicas %v, want both (the panic threshold keeps them in rotation)", ej)
			}
			if f0.Rejected() == rejected {
				t.Error("with every replica ejected, the panic threshold did not put l8-gen-0 back")
			}
			f0.SetReject(0)
			f1.SetReject(0)
		})
	}
}

// TestEngineWithoutItsModelIsTheReplicasFault: an engine that no longer
// serves the model its replica registered (the simulator answers vLLM's
// own 404 "The model `x` does not exist.") is the replica's fault, not
// the client's: every request is answered 200 by the other replica, each
// such 404 is retried, and the streak ejects the replica as a 5xx streak
// does. With no replica left that serves the model, the client gets an
// explicit 503, never a 404 for a model the gateway lists.
func TestEngineWithoutItsModelIsTheReplicasFault(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: l8()})
	url := st.GatewayURL()
	f0, f1 := st.Faults("l8-gen-0"), st.Faults("l8-gen-1")
	f0.SetModelGone(true)
	for i := range 40 {
		o := send(context.Background(), url, chatBody("chat-small", 2, i%2 == 0))
		if o.status != 200 || !o.done || o.replica != "l8-gen-1" {
			t.Errorf("engine l8-gen-0 without its model: %v", o)
		}
	}
	missed := f0.Rejected()
	retries := metric(st, "switchyard_gateway_retries_total", nil)
	if missed == 0 || retries != float64(missed) {
		t.Errorf("%d requests reached the engine without its model, %v retries; want one retry each", missed, retries)
	}
	if n := metric(st, "switchyard_adapter_engine_failures_total", map[string]string{"replica": "l8-gen-0", "kind": "model"}); n != float64(missed) {
		t.Errorf("l8-gen-0 counted %v failures of kind model, want %d", n, missed)
	}
	if ej := metric(st, "switchyard_broker_ejections_total", map[string]string{"replica": "l8-gen-0"}); ej < 1 || missed > subjects.EjectAfterFailures+2 {
		t.Errorf("%d requests reached the engine without its model, %v ejections; want ejection after %d", missed, ej, subjects.EjectAfterFailures)
	}
	t.Logf("engine without its model: 40 of 40 requests served by the other replica, %d reached it before its replica was ejected", missed)

	f1.SetModelGone(true)
	for range 4 {
		if o := send(context.Background(), url, chatBody("chat-small", 2, false)); o.status != 503 || o.code == "" {
			t.Errorf("no engine serving the model: %v; want an explicit 503", o)
		}
	}
}

// TestEngineDeathMidResponseIsExplicit kills an engine under a stream and
// under a non-streamed generation that cannot be continued elsewhere (logprobs;
// resume_test.go has those that can): the stream ends with an SSE error
// event, the other with a 502, never a silent truncation. Requests meanwhile go to
// the other replica (a refused connection is retried), and the engine
// serves again after its restart.
func TestEngineDeathMidResponseIsExplicit(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: l8(), Speed: 1})
	url := st.GatewayURL()
	f := st.Faults("l8-gen-0")
	// Both requests land on l8-gen-0: l8-gen-1 turns them away for now.
	st.Faults("l8-gen-1").SetReject(503)
	noResume := func(body string) string {
		return strings.Replace(body, `"max_tokens"`, `"logprobs":true,"max_tokens"`, 1)
	}
	stream := openStream(context.Background(), t, url, noResume(chatBody("chat-small", 2000, true)))
	nonStream := make(chan outcome, 1)
	go func() { nonStream <- send(context.Background(), url, noResume(chatBody("chat-small", 2000, false))) }()
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if n := st.Engine("l8-gen-0").InFlight(); n != 2 {
			return fmt.Errorf("%d requests in the engine", n)
		}
		return nil
	})

	st.Faults("l8-gen-1").SetReject(0)
	killed := time.Now()
	f.Kill()
	o := readAnswer(stream)
	stream.Body.Close()
	if o.done || o.code != subjects.CodeUpstreamError {
		t.Errorf("stream whose engine died: %v; want an SSE error event upstream_error", o)
	}
	ns := <-nonStream
	if ns.status != 502 || ns.code != subjects.CodeUpstreamError {
		t.Errorf("non-streamed generation whose engine died: %v; want 502 upstream_error", ns)
	}
	t.Logf("engine killed: the stream failed explicitly after %v", time.Since(killed).Round(time.Millisecond))
	for range 10 {
		if o := send(context.Background(), url, chatBody("chat-small", 2, false)); o.status != 200 || o.replica != "l8-gen-1" {
			t.Errorf("while l8-gen-0's engine is down: %v", o)
		}
	}
	if err := f.Restart(); err != nil {
		t.Fatal(err)
	}
	took := testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if got := spread(t, url, "chat-small", 10); got["l8-gen-0"] == 0 {
			return fmt.Errorf("l8-gen-0 gets nothing yet: %v", got)
		}
		return nil
	})

	t.Logf("engine restarted: serving again after %v", took.Round(time.Millisecond))
}

// TestClientDisconnectCancelsTheEngineCall: the engine stops working on a
// request within a second of its client going away, streamed or not.
func TestClientDisconnectCancelsTheEngineCall(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed("l8-gen-0"), Speed: 1})
	eng := st.Engine("l8-gen-0")
	for _, stream := range []bool{true, false} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan outcome, 1)
			go func() { done <- send(ctx, st.GatewayURL(), chatBody("chat-small", 4000, stream)) }()
			testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
				if n := eng.InFlight(); n != 1 {
					return fmt.Errorf("%d in flight", n)
				}
				return nil
			})

			cancel()
			took := testkit.CheckFor(t, time.Second, 10*time.Millisecond, func() error {
				if n := eng.InFlight(); n != 0 {
					return fmt.Errorf("the engine still works on %d request(s)", n)
				}
				return nil
			})

			<-done
			t.Logf("client gone → engine call cancelled in %v", took.Round(time.Millisecond))
		})
	}
}

// TestLongGenerationIsNotMistakenForDead runs a 1.5 s non-streamed
// generation and a long prefill against a 400 ms idle timeout: keepalives
// every 100 ms keep them alive. Without keepalives the same generation is
// cut at the idle timeout, which shows the test can fail.
func TestLongGenerationIsNotMistakenForDead(t *testing.T) {
	long := chatBody("chat-small", 280, false) // 280 tokens × 5 ms ≈ 1.5 s
	prefill := `{"model":"chat-small","max_tokens":2,"stream":true,"messages":[{"role":"user","content":"` +
		strings.Repeat("word ", 6000) + `"}]}` // ≈ 7500 tokens × 100 µs of prefill
	for _, tc := range []struct {
		name      string
		keepalive time.Duration
		wantOK    bool
	}{
		{"keepalives every 100ms", 100 * time.Millisecond, true},
		{"no keepalive within the idle timeout", 5 * time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := startStack(t, devstack.Config{
				Replicas: devstack.ReplicasNamed("l8-gen-0"), Speed: 1, KeepaliveEvery: tc.keepalive,
				Gateway: gateway.Config{IdleTimeout: 400 * time.Millisecond},
			})
			o := send(context.Background(), st.GatewayURL(), long)
			if tc.wantOK != (o.status == 200 && o.done) {
				t.Errorf("1.5 s generation: %v", o)
			}
			if !tc.wantOK && (o.status != 504 || o.code != subjects.CodeUpstreamTimeout) {
				t.Errorf("without keepalives: %v; want 504 upstream_timeout", o)
			}
			t.Logf("1.5 s generation: %v", o)
			if tc.wantOK {
				p := send(context.Background(), st.GatewayURL(), prefill)
				if p.status != 200 || !p.done {
					t.Errorf("long prefill: %v", p)
				}
				t.Logf("long prefill: %v", p)
			}
		})
	}
}

// TestSlowClientFailsOnlyItsOwnStream: one client stops reading a long
// stream. Other clients stream to [DONE] all along, including during the
// write timeout in which the gateway's write to the slow client is blocked;
// then the slow stream is cut, its engine call cancelled and its
// connection closed while the client still holds its end.
func TestSlowClientFailsOnlyItsOwnStream(t *testing.T) {
	// Neither the accept timeout nor the NATS link check is under test: on
	// a loaded machine an accept or a pong can come later than their
	// default second, and the request is retried without the only replica
	// (no_replicas) or refused for a silent link (router_unavailable).
	const writeTimeout = 2 * time.Second
	st := startStack(t, devstack.Config{
		Replicas: devstack.ReplicasNamed("l8-gen-0"), Speed: 40,
		Gateway: gateway.Config{WriteTimeout: writeTimeout, HandoffDepth: 64,
			AcceptTimeout: 10 * time.Second, LinkCheck: 10 * time.Second},
	})
	url := st.GatewayURL()
	eng := st.Engine("l8-gen-0")

	// The slow client: reads the head, then nothing, on a small receive
	// buffer so the gateway's writes block once the socket buffers fill.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", strings.NewReader(chatBody("chat-small", 60000, true)))
	resp, err := slowClient(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()

	var (
		mu   sync.Mutex
		ends []time.Time // when each normal stream completed
	)
	// The cut is after the start of the last poll that did not see it and
	// before the end of the one that did.
	notYet, cut := time.Now(), time.Time{}
	if metric(st, "switchyard_gateway_stream_errors_total", map[string]string{"cause": "slow_client"}) != 0 {
		t.Fatal("the slow stream was cut before the others started")
	}
	// The normal streams are shorter than their mailboxes (HandoffDepth):
	// however late a starved machine runs their writers, none overflows.
	stop := testkit.Load(t, 6, func(_, _ int) {
		o := send(context.Background(), url, chatBody("chat-small", 20, true))
		if o.status != 200 || !o.done {
			t.Errorf("a normal stream beside the slow one: %v", o)
		}
		mu.Lock()
		ends = append(ends, time.Now())
		mu.Unlock()
	})
	cutAfter := testkit.CheckFor(t, 60*time.Second, 10*time.Millisecond, func() error {
		start := time.Now()
		if metric(st, "switchyard_gateway_stream_errors_total", map[string]string{"cause": "slow_client"}) == 0 {
			notYet = start
			return errors.New("the slow stream is not cut yet")
		}
		cut = time.Now()
		return nil
	})
	stop()
	testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		if n := eng.InFlight(); n != 0 {
			return fmt.Errorf("the engine still works on %d request(s)", n)
		}
		return nil
	})

	// The gateway's write to the slow client was blocked for the whole
	// write timeout before the cut: the streams that ended then prove the
	// others were not held up by it. Only the part of it that surely came
	// before the cut is counted: from the write timeout before the poll
	// that saw the cut to the start of the one before it. A machine so
	// loaded that its polls leave less than a third of it cannot tell.
	blocked, blockedEnd := cut.Add(-writeTimeout), notYet
	if blockedEnd.Sub(blocked) < writeTimeout/3 {
		t.Fatalf("the cut was seen %v after the poll before it: too late to tell when the write was blocked", cut.Sub(notYet).Round(time.Millisecond))
	}
	during := 0
	for _, e := range ends { // stop waited for every stream
		if e.After(blocked) && e.Before(blockedEnd) {
			during++
		}
	}
	if during < 2 {
		t.Errorf("%d normal streams completed while the slow client's write was blocked, want several", during)
	}
	t.Logf("slow client stalled; its stream cut %v later and the engine call cancelled; %d normal streams completed meanwhile, %d of them while the gateway's write to it was blocked",
		cutAfter.Round(time.Millisecond), len(ends), during)
	// Its connection is let go while the client still holds its end, not
	// kept for a client that never reads: with the others' idle ones
	// closed, none is left open. The gateway first tries the stream's
	// error event for one more write timeout. Idle ones are closed on every
	// poll: a connection goes back to the client's pool a moment after its
	// body is read.
	testkit.CheckFor(t, 4*writeTimeout+5*time.Second, 50*time.Millisecond, func() error {
		http.DefaultClient.CloseIdleConnections()
		if n := metric(st, "switchyard_gateway_open_connections", nil); n != 0 {
			return fmt.Errorf("%v client connections still open", n)
		}
		return nil
	})
	// The slow client, reading at last, finds its stream ended, not complete.
	done, _, _ := readSSE(bufio.NewReader(resp.Body))
	if done {
		t.Error("the slow client's stream completed; it should have been cut")
	}
}
