package gateway_test

import (
	"bufio"
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

// A request past the gateway's limit of open requests (--max-inflight
// here) is refused 503 gateway_overloaded with Retry-After before its
// body is read: the client that sent only its headers has its answer.
// The places come back when the requests end.
func TestPastTheLimitIsRefusedBeforeTheBody(t *testing.T) {
	release := make(chan struct{})
	var released sync.Once
	free := func() { released.Do(func() { close(release) }) }
	defer free() // a failure below must not leave the admitted requests waiting
	u := newUpstream(t, gateway.Config{MaxInflight: 2}, func(r *reply, _ int) {
		r.accept("r-0")
		r.head(200, "text/event-stream")
		<-release
		r.send(nil, "data: [DONE]\n\n")
		r.end("")
	})
	done := make(chan result, 2)
	for range 2 {
		go func() { done <- u.post(true) }()
	}
	testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, testkit.Cond("two requests open", func() bool { return u.attempts.Load() == 2 }))

	conn, err := net.Dial("tcp", strings.TrimPrefix(u.gw, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Headers only: the body it announces never comes.
	if _, err := conn.Write([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to a request past the limit before its body: %v", err)
	}
	body := make([]byte, 512)
	n, _ := resp.Body.Read(body)
	if resp.StatusCode != 503 || !strings.Contains(string(body[:n]), subjects.CodeGatewayOverloaded) || resp.Header.Get("Retry-After") == "" {
		t.Errorf("got %d %q Retry-After %q; want 503 %s with Retry-After", resp.StatusCode, body[:n], resp.Header.Get("Retry-After"), subjects.CodeGatewayOverloaded)
	}
	if n := u.counter("switchyard_gateway_overloaded_total", map[string]string{"priority": "interactive"}); n != 1 {
		t.Errorf("switchyard_gateway_overloaded_total{priority=interactive} = %v, want 1", n)
	}
	if n := u.counter("switchyard_gateway_inflight_limit", nil); n != 2 {
		t.Errorf("switchyard_gateway_inflight_limit = %v, want 2 (the ceiling)", n)
	}
	if n := u.attempts.Load(); n != 2 {
		t.Errorf("%d requests reached the bus, want the 2 admitted", n)
	}

	// A whole request refused keeps its connection: the next request on
	// it is answered too, with no new connection; one announcing more
	// than refusedDrain closes it.
	kept, err := net.Dial("tcp", strings.TrimPrefix(u.gw, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer kept.Close()
	_ = kept.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(kept)
	small := `{"model":"chat-small","messages":[{"role":"user","content":"hi"}]}`
	for i, big := range []bool{false, false, true} {
		length := len(small)
		if big {
			length = 1 << 20 // announced, never sent
		}
		req := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", length)
		if !big {
			req += small
		}
		if _, err := kept.Write([]byte(req)); err != nil {
			t.Fatalf("request %d on the kept connection: %v", i+1, err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d on the kept connection: no answer: %v", i+1, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != 503 || resp.Close == !big {
			t.Errorf("request %d (body announced %d bytes): %d, connection closed %v; want 503, closed only past the drain", i+1, length, resp.StatusCode, resp.Close)
		}
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("after the refusal of a long body: %v, want the connection closed", err)
	}

	free()
	for range 2 {
		if s := <-done; s.status != 200 {
			t.Errorf("an admitted request got %d %s", s.status, s.code)
		}
	}
	if s := u.post(true); s.status != 200 {
		t.Errorf("after the two ended: %d %s; want their places given back", s.status, s.code)
	}
}
