package gateway_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// relay carries TCP connections to a NATS server and can go silent: cut,
// it stops carrying bytes either way and closes nothing, as a network link
// set down does; healed, it carries on with what was held.
type relay struct {
	ln     net.Listener
	to     string
	mu     sync.Mutex
	healed chan struct{} // nil while the link carries; closed by heal
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newRelay(t *testing.T, to string) *relay {
	t.Helper()
	r := &relay{ln: testkit.Listen(t), to: to}
	r.wg.Go(r.accept)
	t.Cleanup(func() {
		r.heal()
		_ = r.ln.Close()
		r.mu.Lock()
		for _, c := range r.conns {
			_ = c.Close()
		}
		r.mu.Unlock()
		r.wg.Wait()
	})
	return r
}

func (r *relay) url() string { return "nats://" + r.ln.Addr().String() }

func (r *relay) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", r.to)
		if err != nil {
			_ = c.Close()
			continue
		}
		r.mu.Lock()
		r.conns = append(r.conns, c, s)
		r.mu.Unlock()
		r.wg.Go(func() { r.pipe(s, c) })
		r.wg.Go(func() { r.pipe(c, s) })
	}
}

// pipe copies src to dst, holding each read while the link is cut.
func (r *relay) pipe(dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		r.mu.Lock()
		healed := r.healed
		r.mu.Unlock()
		if healed != nil {
			<-healed
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (r *relay) cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.healed == nil {
		r.healed = make(chan struct{})
	}
}

func (r *relay) heal() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.healed != nil {
		close(r.healed)
		r.healed = nil
	}
}

// A gateway whose NATS link goes silent (cut, its TCP connection still
// open) turns unready within a few link checks, and meanwhile answers new
// requests 503 router_unavailable with Retry-After at once, not a 504 after
// the accept timeout. Healed, it serves again by itself.
func TestSilentNATSLinkIsUnreadyAndFailsFast(t *testing.T) {
	var rl *relay
	const acceptTimeout = 5 * time.Second
	u := newUpstreamVia(t, gateway.Config{LinkCheck: 100 * time.Millisecond, AcceptTimeout: acceptTimeout},
		func(r *reply, _ int) { r.stream("r-0", 2) },
		func(url string) string {
			rl = newRelay(t, strings.TrimPrefix(url, "nats://"))
			return rl.url()
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

	rl.cut()
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
	}

	rl.heal()
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
