//go:build unix

package gateway_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
)

// A gateway on an inherited socket (fd:N) leaves the connections queued on
// it until its routing table is loaded: a request made while the previous
// process restarted is routed, not failed with "not loaded yet".
func TestInheritedSocketWaitsForTheTable(t *testing.T) {
	_, natsURL := natstest.Start(t)
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	seedDevTable(t, nc)

	ln := testkit.Listen(t) // this process never accepts on it
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd, err := syscall.Dup(int(f.Fd())) // the gateway owns and closes this one
	if err != nil {
		t.Fatal(err)
	}
	// The request is queued on the socket before any gateway runs.
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := `{"model":"chat-small","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)

	g, err := gateway.New(nc, gateway.Config{Listen: fmt.Sprintf("fd:%d", fd), AcceptTimeout: 100 * time.Millisecond, Decide: gateway.DecideBroker})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = g.Run(rctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })

	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	// No broker runs: the request, admitted by the table (anonymous access
	// on), is published and fails for want of a broker; answered before the
	// table loaded, it would have been "not loaded yet".
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "no broker is available") {
		t.Fatalf("the queued request: %d %s; want 503 no broker is available", resp.StatusCode, b)
	}
}
