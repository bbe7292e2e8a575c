package test

import (
	"bufio"
	"context"
	"errors"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// exited waits for cmd and returns its exit code, or -1 after total.
func exited(cmd *exec.Cmd, done <-chan error, total time.Duration) (int, time.Duration) {
	start := time.Now()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode(), time.Since(start)
		}
		if err != nil {
			return -2, time.Since(start)
		}
		return 0, time.Since(start)
	case <-time.After(total):
		_ = cmd.Process.Kill()
		return -1, time.Since(start)
	}
}

// TestSIGTERMShutsDownGracefully runs the real binary: `switchyard dev`,
// and a second `switchyard broker` in the queue group. SIGTERM on the
// broker under load loses no request and delays none to the accept
// timeout; SIGTERM on dev stops new work at once, lets a slow stream
// finish, and exits 0 within the grace.
func TestSIGTERMShutsDownGracefully(t *testing.T) {
	bin := binary(t)
	var devOut, devErr testkit.SyncBuffer
	data := t.TempDir()
	dev := exec.Command(bin, "dev", "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:-1", "--data", data, "--speed", "1")
	dev.Stdout, dev.Stderr = &devOut, &devErr
	if err := dev.Start(); err != nil {
		t.Fatal(err)
	}
	devDone := make(chan error, 1)
	go func() { devDone <- dev.Wait() }()
	t.Cleanup(func() { _ = dev.Process.Kill() })
	urls := regexp.MustCompile(`gateway\s+(http://\S+)[\s\S]*NATS\s+(nats://\S+)`)
	var gw, natsURL string
	testkit.CheckFor(t, 60*time.Second, 10*time.Millisecond, func() error {
		m := urls.FindStringSubmatch(devOut.String())
		if m == nil {
			return errors.New("dev has not printed its URLs: " + devErr.String())
		}
		gw, natsURL = m[1], m[2]
		return nil
	})

	t.Run("broker", func(t *testing.T) {
		var bErr testkit.SyncBuffer
		b := exec.Command(bin, "broker", "--nats", natsURL, "--creds", filepath.Join(data, "creds", "broker.creds"),
			"--metrics-listen", "", "--state-dir", t.TempDir(), "--id", "ext-broker")
		b.Stderr = &bErr
		if err := b.Start(); err != nil {
			t.Fatal(err)
		}
		bDone := make(chan error, 1)
		go func() { bDone <- b.Wait() }()
		testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
			if !strings.Contains(bErr.String(), "broker serving") {
				return errors.New("broker not serving yet")
			}
			return nil
		})

		var (
			mu       sync.Mutex
			outcomes []outcome
		)
		stop := testkit.Load(t, 4, func(_, _ int) {
			o := send(context.Background(), gw, chatBody("chat-small", 1, false))
			mu.Lock()
			outcomes = append(outcomes, o)
			mu.Unlock()
		})
		time.Sleep(300 * time.Millisecond) // load before the signal
		if err := b.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		code, took := exited(b, bDone, 10*time.Second)
		time.Sleep(300 * time.Millisecond) // and after it
		stop()
		if code != 0 {
			t.Errorf("broker exit code %d after %v: %s", code, took, bErr.String())
		}
		var slowest time.Duration
		for _, o := range outcomes {
			if o.status != 200 || !o.done {
				t.Errorf("request during the broker's shutdown: %v", o)
			}
			slowest = max(slowest, o.took)
		}
		if slowest >= time.Second {
			t.Errorf("a request waited %v: the stopping broker dropped it and the gateway waited for the accept timeout", slowest)
		}
		t.Logf("broker exited 0 %v after SIGTERM; %d requests under way, all 200, slowest %v",
			took.Round(time.Millisecond), len(outcomes), slowest.Round(time.Millisecond))
	})

	t.Run("dev", func(t *testing.T) {
		resp := openStream(context.Background(), t, gw, chatBody("chat-large", 300, true)) // ≈1.5 s
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		signalled := time.Now()
		if err := dev.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		// No new work: the listener closes at once.
		refusedIn := testkit.CheckFor(t, 2*time.Second, 10*time.Millisecond, func() error {
			r, err := http.Post(gw+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("chat-small", 1, false)))
			if err != nil {
				return nil
			}
			r.Body.Close()
			return errors.New("still accepting requests")
		})

		done, code, err := readSSE(br)
		if !done || code != "" || err != nil {
			t.Errorf("the stream in flight at SIGTERM: done %v error event %q err %v; want it complete", done, code, err)
		}
		streamEnded := time.Since(signalled)
		exit, took := exited(dev, devDone, 30*time.Second)
		if exit != 0 {
			t.Errorf("dev exit code %d: %s", exit, devErr.String())
		}
		if !strings.Contains(devOut.String(), "stopping") {
			t.Errorf("dev did not say it was stopping: %s", devOut.String())
		}
		t.Logf("dev: new connections refused %v after SIGTERM; the stream in flight completed %v after it; exit 0 %v after that",
			refusedIn.Round(time.Millisecond), streamEnded.Round(time.Millisecond), took.Round(time.Millisecond))
	})
}
