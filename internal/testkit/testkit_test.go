package testkit_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/internal/testkit"
)

func TestMain(m *testing.M) { testkit.Main(m) }

func TestCheckForReturnsOnceTheConditionHolds(t *testing.T) {
	var calls int
	testkit.CheckFor(t, 10*time.Second, time.Millisecond, func() error {
		calls++
		if calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if calls != 3 {
		t.Fatalf("f called %d times, want 3", calls)
	}
}

func TestPollGivesUpWithTheLastError(t *testing.T) {
	var calls int
	took, err := testkit.Poll(20*time.Millisecond, time.Millisecond, func() error {
		calls++
		return errors.New("never")
	})
	if err == nil || err.Error() != "never" || took < 20*time.Millisecond || calls < 2 {
		t.Fatalf("Poll = %v, %v after %d calls; want the error after at least 20ms", took, err, calls)
	}
	if _, err := testkit.Poll(time.Second, time.Millisecond, func() error { return nil }); err != nil {
		t.Fatal(err)
	}
}

func TestNoGoroutinesLeftPassesWhenTheTestStopsWhatItStarted(t *testing.T) {
	testkit.NoGoroutinesLeft(t)
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-done
	}()
	close(done)
	<-stopped
}

// recorder is a testing.TB whose failures and cleanups the test sees.
type recorder struct {
	testing.TB
	failed   bool
	cleanups []func()
}

func (r *recorder) Helper()               {}
func (r *recorder) Error(...any)          { r.failed = true }
func (r *recorder) Errorf(string, ...any) { r.failed = true }
func (r *recorder) Cleanup(f func())      { r.cleanups = append(r.cleanups, f) }

func TestNoGoroutinesLeftFailsWhenOneIsLeft(t *testing.T) {
	r := &recorder{TB: t}
	testkit.NoGoroutinesLeft(r)
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-done
	}()
	for _, f := range r.cleanups {
		f()
	}
	close(done)
	<-stopped
	if !r.failed {
		t.Fatal("a goroutine still running at cleanup did not fail the test")
	}
}

func TestCondNamesWhatIsAwaited(t *testing.T) {
	err := testkit.Cond("the engine", func() bool { return false })()
	if err == nil || err.Error() != "still waiting for the engine" {
		t.Fatalf("got %v", err)
	}
	if err := testkit.Cond("x", func() bool { return true })(); err != nil {
		t.Fatal(err)
	}
}

func TestLoadRunsEveryWorkerUntilStopped(t *testing.T) {
	var seen [3]atomic.Int64
	stop := testkit.Load(t, 3, func(w, i int) { seen[w].Add(1) })
	testkit.CheckFor(t, 10*time.Second, time.Millisecond, func() error {
		for w := range seen {
			if seen[w].Load() < 2 {
				return errors.New("a worker has not looped twice")
			}
		}
		return nil
	})
	stop()
	n := seen[0].Load()
	time.Sleep(5 * time.Millisecond)
	if seen[0].Load() != n {
		t.Fatal("a worker ran after stop returned")
	}
	stop() // idempotent, and the cleanup calls it again
}

func TestListenHandsOverABoundListener(t *testing.T) {
	ln := testkit.Listen(t)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })}
	go srv.Serve(ln)
	defer srv.Close()
	resp, err := http.Get("http://" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 204 {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

func TestSumAddsTheMatchingSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "requests_total"}, []string{"code", "pool"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "in_flight"})
	reg.MustRegister(c, g)
	c.WithLabelValues("200", "a").Add(3)
	c.WithLabelValues("200", "b").Add(4)
	c.WithLabelValues("503", "a").Add(5)
	g.Set(7)
	for _, tc := range []struct {
		name string
		want map[string]string
		sum  float64
	}{
		{"requests_total", nil, 12},
		{"requests_total", map[string]string{"code": "200"}, 7},
		{"requests_total", map[string]string{"code": "200", "pool": "b"}, 4},
		{"requests_total", map[string]string{"code": "404"}, 0},
		{"in_flight", nil, 7},
		{"missing_total", nil, 0},
	} {
		if got := testkit.Sum(reg, tc.name, tc.want); got != tc.sum {
			t.Errorf("Sum(%s, %v) = %v, want %v", tc.name, tc.want, got, tc.sum)
		}
	}
}

// TestRelayDelaysWhatTheServerSends: a relay's delay holds the server's
// bytes for it, in order; what the client sends is not held.
func TestRelayDelaysWhatTheServerSends(t *testing.T) {
	ln := testkit.Listen(t)
	var echoed sync.WaitGroup
	t.Cleanup(echoed.Wait) // after the relay closed its connections
	echoed.Go(func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c)
	})
	t.Cleanup(func() { ln.Close() })
	r := testkit.NewRelay(t, ln.Addr().String())
	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	trip := func(msgs ...string) (string, time.Duration) {
		t.Helper()
		start := time.Now()
		want := 0
		for _, m := range msgs {
			if _, err := c.Write([]byte(m)); err != nil {
				t.Fatal(err)
			}
			want += len(m)
		}
		buf := make([]byte, want)
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
		return string(buf), time.Since(start)
	}
	if got, _ := trip("hello"); got != "hello" {
		t.Fatalf("echoed %q", got)
	}
	const delay = 60 * time.Millisecond
	r.Delay(delay)
	got, took := trip("a", "b", "c")
	if got != "abc" || took < delay || took > delay+5*time.Second {
		t.Errorf("delayed %v: echoed %q after %v, want abc after about %v", delay, got, took, delay)
	}
	r.Delay(0)
	if got, _ := trip("d"); got != "d" {
		t.Errorf("delay 0 again: echoed %q", got)
	}
}

// TestAStuckTestIsNamedBeforeTheTimeout runs this test binary again with a
// test that never ends, 200 calls deep (past what a stack trace prints
// whole) beside a goroutine it started, and a 10 s -timeout: Main stops it
// before go test's own timeout, says where both goroutines wait, the test's
// last, and names the test in the output's last line.
func TestAStuckTestIsNamedBeforeTheTimeout(t *testing.T) {
	if os.Getenv("TESTKIT_STUCK") == "1" {
		never := make(chan struct{})
		go func() { <-never }()
		stuckDeep(200, never)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestAStuckTestIsNamedBeforeTheTimeout$", "-test.timeout=10s")
	cmd.Env = append(os.Environ(), "TESTKIT_STUCK=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("a stuck test binary: %v, want exit status 1; output:\n%s", err, out)
	}
	text := strings.TrimSpace(string(out))
	last := text[strings.LastIndexByte(text, '\n')+1:]
	if !strings.HasPrefix(last, "testkit: stuck near the 10s timeout: ") || !strings.HasSuffix(last, "testkit_test.TestAStuckTestIsNamedBeforeTheTimeout") {
		t.Errorf("the last line %q does not name the stuck test:\n%s", last, out)
	}
	helper := strings.Index(text, "in github.com/switchyard-llm/switchyard/internal/testkit_test.TestAStuckTestIsNamedBeforeTheTimeout.func1(")
	runner := strings.Index(text, "in github.com/switchyard-llm/switchyard/internal/testkit_test.stuckDeep(")
	if helper < 0 || runner < 0 || helper > runner {
		t.Errorf("want the goroutine the test started (at %d), then the test's own, waiting in stuckDeep (at %d):\n%s", helper, runner, out)
	}
	for _, unwanted := range []string{"panic: test timed out", "TestMain"} {
		if strings.Contains(text, unwanted) {
			t.Errorf("the output says %q:\n%s", unwanted, out)
		}
	}
}

// stuckDeep waits on never depth calls deep.
func stuckDeep(depth int, never chan struct{}) {
	if depth > 0 {
		stuckDeep(depth-1, never)
		return
	}
	<-never
}
