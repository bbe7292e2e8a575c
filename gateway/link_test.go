package gateway_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/subjects"
)

// A gateway whose NATS link goes silent (cut, its TCP connection still
// open) turns unready within a few link checks, and meanwhile answers new
// requests 503 router_unavailable with Retry-After at once, not a 504 after
// the accept timeout. Healed, it serves again by itself.
func TestSilentNATSLinkIsUnreadyAndFailsFast(t *testing.T) {
	var rl *testkit.Relay
	const acceptTimeout = 5 * time.Second
	u := newUpstreamVia(t, gateway.Config{LinkCheck: 100 * time.Millisecond, AcceptTimeout: acceptTimeout},
		func(r *reply, _ int) { r.stream("r-0", 2) },
		func(url string) string {
			rl = testkit.NewRelay(t, strings.TrimPrefix(url, "nats://"))
			return rl.URL()
		})
	// A broker for /readyz's ping.
	if _, err := u.nc.Subscribe("$SRV.PING."+subjects.BrokerService, func(m *nats.Msg) { _ = m.Respond([]byte(`{}`)) }); err != nil {
		t.Fatal(err)
	}
	ready := func() (int, string) {
		c := http.Client{Timeout: 5 * time.Second}
		resp, err := c.Get(u.gw + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if s, b := ready(); s != 200 {
			return errors.New(b)
		}
		return nil
	})
	if r := u.post(true); r.status != 200 {
		t.Fatalf("before the cut: %+v", r)
	}

	rl.Cut()
	took := testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if s, _ := ready(); s == 200 {
			return errors.New("/readyz still 200 with the NATS link cut")
		}
		return nil
	})
	if s, b := ready(); s != 503 || !strings.Contains(b, "silent") {
		t.Errorf("/readyz with the link cut: %d %s; want 503 saying the link is silent", s, b)
	}
	for range 3 {
		start := time.Now()
		resp, err := http.Post(u.gw+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"chat-small","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if d := time.Since(start); resp.StatusCode != 503 || !strings.Contains(string(b), subjects.CodeRouterUnavailable) ||
			resp.Header.Get("Retry-After") == "" || d >= acceptTimeout {
			t.Errorf("a request with the link cut: %d Retry-After %q after %v: %s; want 503 router_unavailable with Retry-After at once",
				resp.StatusCode, resp.Header.Get("Retry-After"), d.Round(time.Millisecond), b)
		}
		if got := resp.Header.Get(gateway.HdrRetryElsewhere); got != "1" {
			t.Errorf("%s = %q on a request sent nowhere; want 1, so a load balancer sends it to another gateway", gateway.HdrRetryElsewhere, got)
		}
	}

	rl.Heal()
	back := testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if s, b := ready(); s != 200 {
			return errors.New(b)
		}
		return nil
	})
	if r := u.post(true); r.status != 200 {
		t.Errorf("after the link healed: %+v", r)
	}
	t.Logf("unready %v after the cut; ready %v after the heal", took.Round(time.Millisecond), back.Round(time.Millisecond))
}

// One late pong (the link held for one link check, then carrying again, as
// on a busy machine) leaves the gateway ready and serving; a cut (no pong
// for two checks in a row) still turns /readyz unready well within 5 s.
func TestOneLatePongDoesNotSilenceTheLinkACutDoes(t *testing.T) {
	var rl *testkit.Relay
	u := newUpstreamVia(t, gateway.Config{}, // LinkCheck: the default, 1s
		func(r *reply, _ int) { r.stream("r-0", 2) },
		func(url string) string {
			rl = testkit.NewRelay(t, strings.TrimPrefix(url, "nats://"))
			return rl.URL()
		})
	if _, err := u.nc.Subscribe("$SRV.PING."+subjects.BrokerService, func(m *nats.Msg) { _ = m.Respond([]byte(`{}`)) }); err != nil {
		t.Fatal(err)
	}
	ready := func() (int, string) {
		c := http.Client{Timeout: 5 * time.Second}
		resp, err := c.Get(u.gw + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	missed := func() float64 { return testkit.Sum(u.reg, "switchyard_gateway_nats_link_missed_pongs_total", nil) }
	silences := func() float64 { return testkit.Sum(u.reg, "switchyard_gateway_nats_link_silences_total", nil) }
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if s, b := ready(); s != 200 {
			return errors.New(b)
		}
		return nil
	})

	// Held until the link check has missed one pong, then carried on.
	m0 := missed()
	rl.Cut()
	testkit.CheckFor(t, 5*time.Second, 2*time.Millisecond, testkit.Cond("a missed pong", func() bool { return missed() > m0 }))
	rl.Heal()
	if s, b := ready(); s != 200 {
		t.Errorf("/readyz after one late pong: %d %s; want 200", s, b)
	}
	if r := u.post(true); r.status != 200 {
		t.Errorf("a request after one late pong: %+v", r)
	}
	if n := silences(); n != 0 {
		t.Errorf("the link was marked silent %v times after one late pong; want never", n)
	}

	cut := time.Now()
	rl.Cut()
	took := testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, testkit.Cond("the link marked silent", func() bool { return silences() > 0 }))
	if s, b := ready(); s != 503 || !strings.Contains(b, "silent") {
		t.Errorf("/readyz %v after the cut: %d %s; want 503 saying the link is silent", time.Since(cut).Round(time.Millisecond), s, b)
	}
	rl.Heal()
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if s, b := ready(); s != 200 {
			return errors.New(b)
		}
		return nil
	})
	t.Logf("a cut marked silent %v after it, %v pongs missed in all", took.Round(time.Millisecond), missed()-m0)
}

// A request in flight when the gateway's NATS connection drops, before any
// replica accepted it, waits for the connection to come back
// (--offline-wait) and goes through it: nothing of it reached the client
// and its body is held.
func TestARequestWaitsForTheLinkAndGoesThrough(t *testing.T) {
	u := newUpstream(t, gateway.Config{OfflineWait: 30 * time.Second}, func(r *reply, attempt int) {
		if attempt == 1 {
			return // lost with the server
		}
		r.stream("r-0", 2)
	})
	done := make(chan result, 1)
	go func() { done <- u.post(true) }()
	testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, testkit.Cond("the first attempt published", func() bool { return u.attempts.Load() == 1 }))
	u.srv = natstest.Restart(t, u.srv)
	select {
	case r := <-done:
		if r.status != 200 || !strings.Contains(r.body, "[DONE]") {
			t.Errorf("after the reconnect: %d %s %q; want the answer", r.status, r.code, r.body)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("the waiting request never answered")
	}
	if n := u.counter("switchyard_gateway_offline_waits_total", nil); n < 1 {
		t.Errorf("offline waits %v, want the retry to have waited for the link", n)
	}
}

// A request in flight when the gateway's NATS connection drops and does
// not come back within --offline-wait is answered 503 router_unavailable;
// when no replica accepted any attempt of it, with
// X-Switchyard-Retry-Elsewhere, so a load balancer gives it to another
// gateway (this one would have sent it again through its own link). Once a
// replica accepted it, the header is not sent: it may be running there.
func TestALostLinkSendsAnUnacceptedRequestElsewhere(t *testing.T) {
	for _, accepted := range []bool{false, true} {
		t.Run(map[bool]string{false: "before-any-accept", true: "after-an-accept"}[accepted], func(t *testing.T) {
			u := newUpstream(t, gateway.Config{OfflineWait: 300 * time.Millisecond, ProbeAfter: 50 * time.Millisecond, IdleTimeout: time.Minute},
				func(r *reply, _ int) {
					if accepted {
						r.accept("r-0") // and nothing more: the server goes
					}
				})
			// The gateway probes a silent accepted replica: a probe says
			// it took the accept. (Subscribed, the replica is there: no
			// no-responders.)
			probed := make(chan struct{}, 1)
			if _, err := u.nc.Subscribe(subjects.New("").ReplicaCancel("r-0"), func(*nats.Msg) {
				select {
				case probed <- struct{}{}:
				default:
				}
			}); err != nil {
				t.Fatal(err)
			}
			_ = u.nc.Flush()
			type answer struct {
				status int
				h      http.Header
				body   string
			}
			done := make(chan answer, 1)
			go func() {
				resp, err := http.Post(u.gw+"/v1/chat/completions", "application/json",
					strings.NewReader(`{"model":"chat-small","messages":[{"role":"user","content":"hi"}]}`))
				if err != nil {
					done <- answer{body: err.Error()}
					return
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				done <- answer{resp.StatusCode, resp.Header, string(b)}
			}()
			testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, testkit.Cond("the attempt published", func() bool { return u.attempts.Load() == 1 }))
			if accepted {
				select {
				case <-probed:
				case <-time.After(10 * time.Second):
					t.Fatal("the gateway never probed the replica that accepted")
				}
			}
			u.srv.Shutdown()
			var a answer
			select {
			case a = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("the request was never answered")
			}
			if a.status != 503 || !strings.Contains(a.body, subjects.CodeRouterUnavailable) || a.h.Get("Retry-After") == "" {
				t.Errorf("%d Retry-After %q: %s; want 503 router_unavailable with Retry-After", a.status, a.h.Get("Retry-After"), a.body)
			}
			want := map[bool]string{false: "1", true: ""}[accepted]
			if got := a.h.Get(gateway.HdrRetryElsewhere); got != want {
				t.Errorf("%s = %q, want %q", gateway.HdrRetryElsewhere, got, want)
			}
		})
	}
}

// A link check's ping under way when the connection is given up and
// replaced (a silent server left for another) is no miss: the new link
// answered the reconnect. With one miss counted on the cut link, the
// reconnect leaves the gateway ready and serving, never silent.
func TestAPingCutShortByAReconnectIsNoMiss(t *testing.T) {
	var rl *testkit.Relay
	u := newUpstreamVia(t, gateway.Config{LinkCheck: 400 * time.Millisecond},
		func(r *reply, _ int) { r.stream("r-0", 2) },
		func(url string) string {
			rl = testkit.NewRelay(t, strings.TrimPrefix(url, "nats://"))
			return rl.URL()
		})
	if r := u.post(true); r.status != 200 {
		t.Fatalf("before the cut: %+v", r)
	}
	rl.Cut()
	testkit.CheckFor(t, 5*time.Second, 2*time.Millisecond, testkit.Cond("a pong missed on the cut link", func() bool {
		return u.counter("switchyard_gateway_nats_link_missed_pongs_total", nil) >= 1
	}))
	// The next ping went out with the miss: the connection is given up
	// under it.
	rl.Drop()
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		if r := u.post(true); r.status != 200 {
			return fmt.Errorf("after the reconnect: %+v", r)
		}
		return nil
	})
	if n := u.counter("switchyard_gateway_nats_link_silences_total", nil); n != 0 {
		t.Errorf("the link was called silent %v times; a ping cut short by a reconnect is no miss", n)
	}
}
