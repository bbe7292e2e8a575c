package natsconn_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn"
)

// natsServer is the nats-server binary of go.mod's version: NATS_SERVER
// (`make test` sets it), else the repository's .cache/tools copy, else one
// built for this test.
func natsServer(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("NATS_SERVER"); p != "" {
		return p
	}
	if p, err := filepath.Abs(filepath.Join("..", ".cache", "tools", "nats-server")); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	bin := filepath.Join(t.TempDir(), "nats-server")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nats-server/v2").CombinedOutput()
	if err != nil {
		t.Fatalf("building nats-server: %v: %s", err, out)
	}
	return bin
}

// A server that stops answering without closing its connections (here
// SIGSTOPped: its sockets stay open, nothing is read or sent) is given up
// within the liveness check's 2 s: the connection moves to the other
// server and carries requests again within 3 s of the stop.
func TestASilentServerIsLeftWithinTwoSeconds(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("SIGSTOP")
	}
	isolate(t)
	bin := natsServer(t)
	silent, first := testkit.StartNATSServer(t, bin)
	_, second := testkit.StartNATSServer(t, bin)

	var logs testkit.SyncBuffer
	nc, err := natsconn.Connect(context.Background(), natsconn.Options{URL: first + "," + second, Logger: slog.New(slog.NewTextHandler(&logs, nil))},
		nats.DontRandomize())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := natsconn.WaitConnected(context.Background(), nc); err != nil {
		t.Fatal(err)
	}
	if got := nc.ConnectedUrl(); got != first {
		t.Fatalf("connected to %s, want the first server %s", got, first)
	}
	echo, err := nats.Connect(second)
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	if _, err := echo.Subscribe("echo", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		t.Fatal(err)
	}
	if err := echo.Flush(); err != nil {
		t.Fatal(err)
	}

	if err := silent.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	moved := movedTo(t, nc, second, stopped, 3*time.Second, &logs, func() error {
		_, err := nc.Request("echo", []byte("x"), 200*time.Millisecond)
		return err
	})
	t.Logf("requests carried by the other server %v after the first went silent", moved.Round(time.Millisecond))
}

// A link cut under a stream of publishes (a relay that stops carrying: the
// sockets stay open, the client's send buffer fills and its write blocks,
// holding the client library's lock) is left within the liveness check's
// 2 s as a silent server is: the check closes the socket, which fails the
// blocked write, rather than waiting on the lock for the write timeout and
// then on ForceReconnect's flush into the same socket (5 s each).
func TestACutLinkUnderWritesIsLeftWithinTwoSeconds(t *testing.T) {
	isolate(t)
	bin := natsServer(t)
	_, first := testkit.StartNATSServer(t, bin)
	_, second := testkit.StartNATSServer(t, bin)
	rl := testkit.NewRelay(t, strings.TrimPrefix(first, "nats://"))

	// The caller's own dialer (as a context's SOCKS proxy is) is still
	// the one that dials: the check wraps it.
	own := &countingDialer{}
	var logs testkit.SyncBuffer
	nc, err := natsconn.Connect(context.Background(), natsconn.Options{URL: rl.URL() + "," + second, Logger: slog.New(slog.NewTextHandler(&logs, nil))},
		nats.DontRandomize(), nats.SetCustomDialer(own))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := natsconn.WaitConnected(context.Background(), nc); err != nil {
		t.Fatal(err)
	}
	if got := nc.ConnectedUrl(); got != rl.URL() {
		t.Fatalf("connected to %s, want the relayed server %s", got, rl.URL())
	}
	if own.dials.Load() == 0 {
		t.Fatal("the caller's dialer was not used")
	}
	// 64 KiB a millisecond: the socket buffers fill soon after the cut.
	stop := make(chan struct{})
	var writing sync.WaitGroup
	writing.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		payload := make([]byte, 64<<10)
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			_ = nc.Publish("fill", payload)
		}
	})
	defer func() { close(stop); writing.Wait() }()

	rl.Cut()
	cut := time.Now()
	// Within the check's 2 s, with room, and well before the 5 s write
	// timeout.
	moved := movedTo(t, nc, second, cut, 4*time.Second, &logs, nil)
	t.Logf("on the other server %v after the cut", moved.Round(time.Millisecond))
}

// movedTo waits until nc is on server and carries (carry, when given,
// passes) and returns how long after since that was; the move must come
// within, and the silent server be warned of in logs.
func movedTo(t *testing.T, nc *nats.Conn, server string, since time.Time, within time.Duration, logs *testkit.SyncBuffer, carry func() error) time.Duration {
	t.Helper()
	var moved time.Duration
	testkit.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		if got := nc.ConnectedUrl(); got != server {
			return fmt.Errorf("still on %q", got)
		}
		if carry != nil {
			if err := carry(); err != nil {
				return err
			}
		}
		moved = time.Since(since)
		return nil
	})
	if moved > within {
		t.Errorf("on the other server and carrying %v after the server went silent, want within %v", moved.Round(time.Millisecond), within)
	}
	if !strings.Contains(logs.String(), "NATS server silent") {
		t.Errorf("no warning of the silent server in:\n%s", logs.String())
	}
	return moved
}

// countingDialer dials as the library does and counts its dials.
type countingDialer struct{ dials atomic.Int64 }

func (d *countingDialer) Dial(network, address string) (net.Conn, error) {
	d.dials.Add(1)
	return (&net.Dialer{Timeout: 2 * time.Second}).Dial(network, address)
}

// Values the liveness check cannot work with are refused, not bent into
// range: a nanosecond interval would reconnect without end.
func TestLivenessTuningIsChecked(t *testing.T) {
	isolate(t)
	for _, o := range []natsconn.Options{{PingInterval: time.Nanosecond}, {PingInterval: 2 * time.Minute}, {MaxPingsOut: -1}, {MaxPingsOut: 101}} {
		o.URL = "nats://127.0.0.1:1"
		if nc, err := natsconn.Connect(context.Background(), o); !errors.Is(err, natsconn.ErrConfig) {
			if nc != nil {
				nc.Close()
			}
			t.Errorf("%+v: err %v, want ErrConfig", o, err)
		}
	}
}
