package gateway_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// gauge reads a gateway gauge.
func (u *upstream) gauge(name string) float64 {
	mfs, _ := u.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

// slowBody is one client whose headers arrived and whose body did not.
type slowBody struct {
	status int
	code   string
	took   time.Duration // from the headers sent to the answer
	err    error
}

// sendSlowBody opens a connection, sends the headers of a 100-byte body
// and then either trickles it at a byte a second or sends 8 bytes and
// stalls. It returns what the gateway answered.
func sendSlowBody(addr string, trickle bool, stop <-chan struct{}) slowBody {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return slowBody{err: err}
	}
	defer c.Close()
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
	start := time.Now()
	if _, err := io.WriteString(c, head+`{"model":`); err != nil {
		return slowBody{err: err}
	}
	var wg sync.WaitGroup
	done := make(chan struct{})
	defer func() { close(done); wg.Wait() }()
	if trickle {
		wg.Go(func() {
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				select {
				case <-done:
					return
				case <-stop:
					return
				case <-tick.C:
					if _, err := c.Write([]byte(" ")); err != nil {
						return
					}
				}
			}
		})
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return slowBody{err: err, took: time.Since(start)}
	}
	defer resp.Body.Close()
	r := slowBody{status: resp.StatusCode, took: time.Since(start)}
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&e)
	r.code = e.Error.Code
	return r
}

// TestSlowBodiesAreCutWhileOthersAreServed: 200 connections whose body
// trickles or never comes are held while a normal request gets its 200 at
// once and a stream longer than the body deadline runs to its end; each
// of the 200 is answered 408 at the deadline.
func TestSlowBodiesAreCutWhileOthersAreServed(t *testing.T) {
	const bodyTimeout = 3 * time.Second
	u := newUpstream(t, gateway.Config{BodyTimeout: bodyTimeout}, func(r *reply, _ int) {
		if !strings.Contains(string(r.m.Data), "slowly") {
			r.stream("r-0", 3)
			return
		}
		r.accept("r-0")
		r.head(200, "text/event-stream")
		for i := range 10 { // 4.5 s: past the body deadline
			if i > 0 {
				time.Sleep(500 * time.Millisecond)
			}
			r.send(nil, fmt.Sprintf("data: {\"i\":%d}\n\n", i))
		}
		r.send(nil, "data: [DONE]\n\n")
		r.end("")
	})
	addr := strings.TrimPrefix(u.gw, "http://")

	const n = 200
	stop := make(chan struct{})
	results := make(chan slowBody, n)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(stop)
	for i := range n {
		wg.Go(func() { results <- sendSlowBody(addr, i%2 == 0, stop) })
	}
	type streamed struct {
		status int
		body   string
		took   time.Duration
		err    error
	}
	slow := make(chan streamed, 1)
	wg.Go(func() {
		start := time.Now()
		resp, err := http.Post(u.gw+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"chat-small","stream":true,"messages":[{"role":"user","content":"answer slowly"}]}`))
		if err != nil {
			slow <- streamed{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		slow <- streamed{status: resp.StatusCode, body: string(b), took: time.Since(start), err: err}
	})

	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, testkit.Cond("200 slow connections open", func() bool {
		return u.gauge("switchyard_gateway_open_connections") >= n
	}))

	start := time.Now()
	if r := u.post(false); r.status != 200 {
		t.Fatalf("a normal request beside %d slow ones: %d %s", n, r.status, r.body)
	}
	took := time.Since(start)
	if len(results) > 0 {
		t.Fatalf("a slow body was answered before the normal request (%v): the slow connections were not held", took)
	}
	t.Logf("normal request answered in %v while %d slow bodies were held", took.Round(time.Millisecond), n)

	for range n {
		select {
		case r := <-results:
			if r.err != nil || r.status != http.StatusRequestTimeout || r.code != subjects.CodeRequestTimeout {
				t.Fatalf("slow body: %d %q %v, want 408 %s", r.status, r.code, r.err, subjects.CodeRequestTimeout)
			}
			if r.took < bodyTimeout-100*time.Millisecond || r.took > bodyTimeout+10*time.Second {
				t.Fatalf("slow body cut after %v, want at the %v deadline", r.took, bodyTimeout)
			}
		case <-time.After(bodyTimeout + 20*time.Second):
			t.Fatal("slow bodies still held long past the deadline")
		}
	}
	s := <-slow
	if s.err != nil || s.status != 200 || !strings.Contains(s.body, `"i":9`) || !strings.Contains(s.body, "[DONE]") {
		t.Fatalf("a stream longer than the body deadline: %d %v %q", s.status, s.err, s.body)
	}
	if s.took < bodyTimeout {
		t.Fatalf("the stream took %v, not past the %v deadline: the test proves nothing", s.took, bodyTimeout)
	}
	http.DefaultClient.CloseIdleConnections()
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, testkit.Cond("every connection closed", func() bool {
		return u.gauge("switchyard_gateway_open_connections") == 0
	}))
}

// TestConnectionsPastTheLimitAreRefused: with --max-conns 2 held, a third
// connection is answered 503 at once, and served again when one closes.
func TestConnectionsPastTheLimitAreRefused(t *testing.T) {
	u := newUpstream(t, gateway.Config{MaxConns: 2}, nil)
	addr := strings.TrimPrefix(u.gw, "http://")
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, testkit.Cond("2 connections open", func() bool {
		return u.gauge("switchyard_gateway_open_connections") == 2
	}))

	get := func() (*http.Response, string) {
		t.Helper()
		tr := &http.Transport{DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get(u.gw + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, body := get()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" || !strings.Contains(body, subjects.CodeRouterUnavailable) {
		t.Fatalf("past the limit: %d Retry-After %q %s, want 503 router_unavailable", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if got := u.counter("switchyard_gateway_connections_refused_total", nil); got != 1 {
		t.Errorf("refused connections = %v, want 1", got)
	}
	held[0].Close()
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, testkit.Cond("a slot free again", func() bool {
		resp, _ := get()
		return resp.StatusCode == 200
	}))
}

// TestSlowBodyOnEveryEndpoint: the body deadline is the gateway's, before
// any endpoint reads a byte, and its 408 comes in the endpoint's own error
// shape (an Anthropic SDK parses only Anthropic's).
func TestSlowBodyOnEveryEndpoint(t *testing.T) {
	u := newUpstream(t, gateway.Config{BodyTimeout: 300 * time.Millisecond}, func(r *reply, _ int) {
		r.t.Errorf("a body cut by its deadline reached the bus: %s", r.m.Data)
	})
	addr := strings.TrimPrefix(u.gw, "http://")
	for _, ep := range []string{subjects.EndpointChat, subjects.EndpointCompletions, subjects.EndpointEmbeddings,
		subjects.EndpointResponses, subjects.EndpointMessages} {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		head := "POST " + ep + " HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
		if _, err := io.WriteString(c, head+`{"model":`); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("%s: %v", ep, err)
		}
		var e struct {
			Type  string `json:"type"`
			Error struct {
				Type string `json:"type"`
				Code string `json:"code"`
			} `json:"error"`
		}
		err = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		c.Close()
		if err != nil || resp.StatusCode != http.StatusRequestTimeout {
			t.Fatalf("%s: %d %v, want 408", ep, resp.StatusCode, err)
		}
		if ep == subjects.EndpointMessages {
			if e.Type != "error" || e.Error.Type == "" {
				t.Errorf("%s: %+v, want Anthropic's {\"type\":\"error\",\"error\":{\"type\":…}}", ep, e)
			}
		} else if e.Error.Code != subjects.CodeRequestTimeout {
			t.Errorf("%s: code %q, want %s", ep, e.Error.Code, subjects.CodeRequestTimeout)
		}
	}
}
