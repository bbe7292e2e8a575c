package test

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestNoFalseReconnectsUnderLoad runs the production shape of `make
// cluster` under test-cluster's load on a machine kept busy beside it
// (LIVENESS_BUSY spinning loops, default three) for LIVENESS_DURATION
// (default 5m), and fails if any part's NATS connection was lost although
// every server was alive: the liveness check (2 s to give up a silent
// server) must tell a starved reader from a dead server, its messages
// counting as proof of life. It fails on a request lost or hung, or none
// served, too. `make test-liveness` runs it.
func TestNoFalseReconnectsUnderLoad(t *testing.T) {
	if os.Getenv("SWITCHYARD_LIVENESS") == "" {
		t.Skip("make test-liveness runs this (minutes)")
	}
	duration := 5 * time.Minute
	if v := os.Getenv("LIVENESS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("LIVENESS_DURATION %q: want a positive duration", v)
		}
		duration = d
	}
	busy := 3
	if v := os.Getenv("LIVENESS_BUSY"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			t.Fatalf("LIVENESS_BUSY %q: want a count", v)
		}
		busy = n
	}
	c := startCluster(t)
	logs := c.printed["logs"]
	if logs == "" {
		t.Fatalf("the launcher printed no logs directory: %v", c.printed)
	}

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	for range busy {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				if i%(1<<20) == 0 {
					runtime.Gosched()
				}
			}
		})
	}
	l := newClusterLoad(c.gateways)
	wg.Go(func() { l.balance(ctx) })
	for w := range 6 {
		wg.Go(func() { l.run(ctx, w) })
	}
	time.Sleep(duration)
	stop()
	wg.Wait()

	total, ok, failed, lost, hung := l.totals()
	t.Logf("%v with %d busy loops: %d requests, %d ok, %d failed explicitly, %d lost, %d hung", duration, busy, total, ok, failed, lost, hung)
	if lost > 0 || hung > 0 {
		t.Errorf("%d requests lost, %d hung", lost, hung)
	}
	if ok == 0 {
		t.Fatalf("no request served: the cluster did not route, so the run says nothing of its connections")
	}
	if failed > 0 {
		t.Logf("failed explicitly, by code: %s", l.failures(time.Time{}))
	}
	files, err := filepath.Glob(filepath.Join(logs, "*.log"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no part's log in %s: %v", logs, err)
	}
	var silent []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			// The check's own reconnects, and every other loss of a
			// connection (the library's pings, a write timeout).
			if strings.Contains(line, "NATS server silent") || strings.Contains(line, "NATS disconnected") {
				silent = append(silent, filepath.Base(f)+": "+line)
			}
		}
	}
	if len(silent) > 0 {
		t.Errorf("%d false reconnects (every server was alive):\n%s", len(silent), strings.Join(silent, "\n"))
	}
	t.Logf("%d parts' logs read, no false reconnect", len(files))
}
