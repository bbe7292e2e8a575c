package gateway_test

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// slowKind is one way a client holds a connection without finishing a
// request.
type slowKind int

const (
	bodyNeverSent  slowKind = iota // headers of a 100-byte body, 9 bytes of it, then nothing
	bodyTrickled                   // the same, then a byte a second
	headerTrickled                 // the request line, then a header byte a second
	idleKeepAlive                  // one whole request answered, then nothing
	bodyUnread                     // a body never sent to a path that answers without reading it
	slowKinds
)

func (k slowKind) String() string {
	return [...]string{"body never sent", "body trickled", "headers trickled", "idle keep-alive", "body unread"}[k]
}

// slowConn is what a slow client saw: the status the gateway answered (0:
// none) and when, and when the gateway closed the socket, both measured
// from the moment the gateway's deadline started to run.
type slowConn struct {
	kind     slowKind
	status   int
	answered time.Duration
	closed   time.Duration
	err      error // the socket was still open when the client gave up
}

// holdSlow opens one connection of kind k, then reads it until the gateway
// closes it (EOF or reset), giving up at giveUp after the deadline started.
func holdSlow(addr string, k slowKind, giveUp time.Duration, stop <-chan struct{}) slowConn {
	r := slowConn{kind: k}
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		r.err = err
		return r
	}
	defer c.Close()
	start := time.Now()
	var trickle string
	switch k {
	case bodyNeverSent, bodyTrickled:
		_, err = io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"+`{"model":`)
		if k == bodyTrickled {
			trickle = strings.Repeat(" ", 91)
		}
	case bodyUnread:
		_, err = io.WriteString(c, "POST /v1/unknown HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"+`{"model":`)
	case headerTrickled:
		_, err = io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\n")
		trickle = "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
	case idleKeepAlive:
		_, err = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
	}
	if err != nil {
		r.err = err
		return r
	}
	br := bufio.NewReader(c)
	if k == idleKeepAlive {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			r.err = err
			return r
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		r.status = resp.StatusCode
		start = time.Now() // the idle time starts with the answer read
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	done := make(chan struct{})
	defer close(done)
	if trickle != "" {
		wg.Go(func() {
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for i := 0; i < len(trickle); i++ {
				select {
				case <-done:
					return
				case <-stop:
					return
				case <-tick.C:
				}
				if _, err := io.WriteString(c, trickle[i:i+1]); err != nil {
					return
				}
			}
		})
	}
	_ = c.SetReadDeadline(start.Add(giveUp))
	if k != idleKeepAlive {
		if resp, err := http.ReadResponse(br, nil); err == nil {
			r.status, r.answered = resp.StatusCode, time.Since(start)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	// Read until the gateway closes: EOF is its FIN, a reset its RST;
	// a timeout is the client giving up on a socket still open.
	_, err = io.Copy(io.Discard, br)
	r.closed = time.Since(start)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		r.err = errors.New("still open after " + r.closed.Round(time.Millisecond).String())
	}
	return r
}

// TestSlowConnectionsAreClosed: 300 connections that never finish a
// request (a body never sent or trickled a byte a second, headers
// trickled, a keep-alive connection left idle, a body never sent to a
// path answered without reading it) against --max-conns 256.
// Each socket is closed by the gateway within a second of its deadline
// and of its answer (those past the limit at once), whatever the client
// does next; a normal
// request is answered 200 throughout once the first deadline has freed
// slots; the open-connections gauge comes back to where it was.
func TestSlowConnectionsAreClosed(t *testing.T) {
	const (
		headerTimeout    = 1 * time.Second
		bodyTimeout      = 2 * time.Second
		keepAliveTimeout = 3 * time.Second
		n                = 300
		maxConns         = 256
		grace            = time.Second // the bound past each deadline, and past each answer
		// lag allows for the gateway reaching 300 connections' requests
		// late on a loaded machine under -race: their deadlines start
		// late too, which a client cannot see. The close after an answer
		// is held to grace alone.
		lag = time.Second
	)
	deadline := map[slowKind]time.Duration{
		bodyNeverSent: bodyTimeout, bodyTrickled: bodyTimeout, bodyUnread: bodyTimeout,
		headerTrickled: headerTimeout, idleKeepAlive: keepAliveTimeout,
	}
	u := newUpstream(t, gateway.Config{
		MaxConns: maxConns, HeaderTimeout: headerTimeout, BodyTimeout: bodyTimeout, KeepAliveTimeout: keepAliveTimeout,
	}, func(r *reply, _ int) { r.stream("r-0", 3) })
	addr := strings.TrimPrefix(u.gw, "http://")
	const open = "switchyard_gateway_open_connections"
	baseline := u.gauge(open)

	stop := make(chan struct{})
	results := make(chan slowConn, n)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(stop)
	begin := time.Now()
	for i := range n {
		k := slowKind(i % int(slowKinds))
		wg.Go(func() { results <- holdSlow(addr, k, deadline[k]+grace+lag+5*time.Second, stop) })
	}

	// A normal request on a connection of its own, twenty a second from
	// the first deadline (and its grace) until every slow client is done.
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	normal := func() (int, error) {
		resp, err := client.Post(u.gw+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"chat-small","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, err = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, err
	}
	normalStop, normalDone := make(chan struct{}), make(chan struct{})
	var served, failed int
	var firstFail string
	wg.Go(func() {
		defer close(normalDone)
		select {
		case <-time.After(time.Until(begin.Add(headerTimeout + grace))):
		case <-normalStop:
			return
		}
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-normalStop:
				return
			case <-tick.C:
			}
			status, err := normal()
			if status == 200 && err == nil {
				served++
			} else if failed++; firstFail == "" {
				firstFail = time.Since(begin).Round(time.Millisecond).String() + ": " + http.StatusText(status)
				if err != nil {
					firstFail += " " + err.Error()
				}
			}
		}
	})

	perKind := make(map[slowKind][]time.Duration)
	var afterAnswer time.Duration // the longest from an answer to the close
	var lateAnswer time.Duration  // the latest 408 past the body deadline
	statuses := make(map[int]int)
	for range n {
		r := <-results
		if r.err != nil {
			t.Errorf("%s: %v (deadline %v)", r.kind, r.err, deadline[r.kind])
			continue
		}
		statuses[r.status]++
		perKind[r.kind] = append(perKind[r.kind], r.closed)
		if r.closed > deadline[r.kind]+grace+lag {
			t.Errorf("%s: closed %v after its deadline started, want within %v", r.kind, r.closed.Round(time.Millisecond), deadline[r.kind]+grace)
		}
		if r.answered > 0 {
			afterAnswer = max(afterAnswer, r.closed-r.answered)
			if r.status == http.StatusRequestTimeout {
				lateAnswer = max(lateAnswer, r.answered-deadline[r.kind])
			}
		}
		if r.answered > 0 && r.closed-r.answered > grace {
			t.Errorf("%s: closed %v after its %d answer, want within %v", r.kind, (r.closed - r.answered).Round(time.Millisecond), r.status, grace)
		}
		switch {
		case r.status == http.StatusServiceUnavailable: // past --max-conns
		case r.kind == bodyNeverSent || r.kind == bodyTrickled:
			if r.status != http.StatusRequestTimeout {
				t.Errorf("%s: answered %d, want 408", r.kind, r.status)
			}
		case r.kind == idleKeepAlive && r.status != 200:
			t.Errorf("%s: first request answered %d", r.kind, r.status)
		case r.kind == bodyUnread && r.status != http.StatusNotFound:
			t.Errorf("%s: answered %d, want 404", r.kind, r.status)
		}
	}
	close(normalStop)
	<-normalDone
	for k := range slowKinds {
		var worst time.Duration
		for _, d := range perKind[k] {
			worst = max(worst, d)
		}
		t.Logf("%s (deadline %v): %d closed, the last %v after its deadline started", k, deadline[k], len(perKind[k]), worst.Round(time.Millisecond))
	}
	t.Logf("the longest from an answer to the close: %v; the latest 408 %v past its deadline", afterAnswer.Round(time.Millisecond), lateAnswer.Round(time.Millisecond))
	t.Logf("answers: %v; normal requests after the first deadline: %d answered 200, %d not", statuses, served, failed)
	// Those past the limit are refused; fewer when some slow ones were
	// already let go before the last dialled.
	if got := u.counter("switchyard_gateway_connections_refused_total", nil); got < 1 || got > n-maxConns {
		t.Errorf("%v connections refused, want 1 to the %d past --max-conns %d", got, n-maxConns, maxConns)
	}
	if failed > 0 || served == 0 {
		t.Errorf("normal requests after the first deadline: %d answered 200, %d not (first: %s)", served, failed, firstFail)
	}
	testkit.CheckFor(t, 2*time.Second, 20*time.Millisecond, testkit.Cond("the open-connections gauge back to its baseline", func() bool {
		return u.gauge(open) == baseline
	}))
}

// TestHTTP2StalledStreamIsResetAlone: on one HTTP/2 connection, a stream
// whose body stalls is answered 408 at the body deadline and reset, while
// a stream that began before it and runs past the deadline completes, and
// the connection takes a new stream after (no GOAWAY, no close).
func TestHTTP2StalledStreamIsResetAlone(t *testing.T) {
	const bodyTimeout = time.Second
	certPEM, keyPEM, pool := testkit.SelfSigned(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	u := newUpstream(t, gateway.Config{BodyTimeout: bodyTimeout, TLSCert: certFile, TLSKey: keyFile}, func(r *reply, _ int) {
		if !strings.Contains(string(r.m.Data), "slowly") {
			r.stream("r-0", 3)
			return
		}
		r.accept("r-0")
		r.head(200, "text/event-stream")
		for i := range 6 { // 2.5 s: past the stalled stream's deadline
			if i > 0 {
				time.Sleep(500 * time.Millisecond)
			}
			r.send(nil, fmt.Sprintf("data: {\"i\":%d}\n\n", i))
		}
		r.send(nil, "data: [DONE]\n\n")
		r.end("")
	})
	base := "https://" + strings.TrimPrefix(u.gw, "http://")
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	var conns sync.Map // local addresses of the connections used
	traced := func(req *http.Request) *http.Request {
		return req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) { conns.Store(i.Conn.LocalAddr().String(), true) },
		}))
	}
	post := func(body io.Reader) (*http.Response, error) {
		req, _ := http.NewRequest("POST", base+"/v1/chat/completions", body)
		req.Header.Set("Content-Type", "application/json")
		return client.Do(traced(req))
	}
	// The first stream opens the connection.
	resp, err := post(strings.NewReader(`{"model":"chat-small","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ProtoMajor != 2 {
		t.Fatalf("first request: %d over %s, want 200 over HTTP/2", resp.StatusCode, resp.Proto)
	}

	long, err := post(strings.NewReader(`{"model":"chat-small","stream":true,"messages":[{"role":"user","content":"answer slowly"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer long.Body.Close()

	pr, pw := io.Pipe()
	defer pw.Close()
	stalled := make(chan *http.Response, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		resp, err := post(pr)
		if err != nil {
			t.Errorf("stalled stream: %v", err)
			close(stalled)
			return
		}
		stalled <- resp
	})
	_, _ = io.WriteString(pw, `{"model":`) // then nothing more
	sr, ok := <-stalled
	if !ok {
		t.FailNow()
	}
	b, _ := io.ReadAll(sr.Body)
	sr.Body.Close()
	if sr.StatusCode != http.StatusRequestTimeout || sr.Header.Get("Connection") != "" {
		t.Fatalf("stalled stream: %d %v %s, want 408 and no Connection header", sr.StatusCode, sr.Header, b)
	}
	// The stream is over at the server: the transport stops taking its body.
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, testkit.Cond("the stalled stream's body to be refused", func() bool {
		_, err := pw.Write([]byte(" "))
		return err != nil
	}))

	b, err = io.ReadAll(long.Body)
	if err != nil || long.StatusCode != 200 || !strings.Contains(string(b), `"i":5`) || !strings.Contains(string(b), "[DONE]") {
		t.Fatalf("the stream beside the stalled one: %d %v %q", long.StatusCode, err, b)
	}
	resp, err = post(strings.NewReader(`{"model":"chat-small","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("a new stream after the reset: %d", resp.StatusCode)
	}
	n := 0
	conns.Range(func(any, any) bool { n++; return true })
	if n != 1 {
		t.Fatalf("%d connections used, want the one", n)
	}
	tr.CloseIdleConnections()
	testkit.CheckFor(t, 5*time.Second, 20*time.Millisecond, testkit.Cond("every connection closed", func() bool {
		return u.gauge("switchyard_gateway_open_connections") == 0
	}))
}
