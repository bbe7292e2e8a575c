package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/lab"
)

// The replay check's setting: the dev stack's engines at replayCheckSpeed,
// the first replayCheckLimit requests of Mooncake's conversation slice, at
// the speedup that loads the dev pool to replayCheckLoad by the lab's
// estimate.
const (
	replayCheckSpeed = 8
	replayCheckLimit = 2000
	replayCheckLoad  = 0.8
	// replayCheckHitPoints is the most the system's and the lab's hit
	// rates may differ (a count of cached tokens, steady from run to run).
	replayCheckHitPoints = 0.03
)

// TestReplayCheck is `make replay-check`: the same slice replayed through
// `switchyard dev` with `switchyard bench --trace`, and through `switchyard
// lab replay --profile dev` at the same speedup, printed side by side. It
// fails when the Switchyard arm's hit rate and the system's differ by more
// than replayCheckHitPoints, or when either run breaks; the TTFT
// differences are figures for docs/benchmarks.md ("Lab against system"),
// meaningful on a quiet machine only (it prints the load average).
func TestReplayCheck(t *testing.T) {
	if os.Getenv("SWITCHYARD_REPLAY_CHECK") == "" {
		t.Skip("make replay-check runs this (about six minutes)")
	}
	loadAtStart := loadAverage()
	trace := filepath.Join(repoRoot(), "lab", "testdata", "mooncake", "conversation_trace.jsonl")
	data, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := lab.LoadTrace(lab.ReplayConfig{Name: trace, R: bytes.NewReader(data), Limit: replayCheckLimit,
		Profile: lab.ReplayProfileDev, Speed: replayCheckSpeed}, lab.Options{Scale: lab.Full})
	if err != nil {
		t.Fatal(err)
	}
	replicas := 0
	for _, r := range devstack.Replicas() {
		if r.Model == lab.DevReplayModel {
			replicas++
		}
	}
	speedup, _ := strconv.ParseFloat(strconv.FormatFloat(replayCheckLoad/tr.Load(replicas), 'g', 2, 64), 64)
	sp := strconv.FormatFloat(speedup, 'f', -1, 64)
	bin := binary(t)
	ctx, cancel := context.WithTimeout(t.Context(), 13*time.Minute)
	defer cancel()

	// The lab first: it takes seconds, and a mistake in it should not wait
	// for the system's minutes.
	labOut := t.TempDir()
	runTool(ctx, t, bin, "lab", "replay", "--trace", trace, "--profile", lab.ReplayProfileDev, "--speed", strconv.Itoa(replayCheckSpeed),
		"--arms", lab.ArmSwitchyard, "--speedups", sp, "--limit", strconv.Itoa(replayCheckLimit), "--out", labOut)
	labRow := readArmRow(t, filepath.Join(labOut, "replay.csv"), lab.ArmSwitchyard)

	gateway := startDevProcess(ctx, t, bin, "--speed", strconv.Itoa(replayCheckSpeed))
	sysOut := t.TempDir()
	runTool(ctx, t, bin, "bench", "--trace", trace, "--target", gateway, "--model", lab.DevReplayModel,
		"--speedup", sp, "--limit", strconv.Itoa(replayCheckLimit), "--out", sysOut)
	sysRow := readArmRow(t, filepath.Join(sysOut, "bench-replay.csv"), "system")

	var b strings.Builder
	fmt.Fprintf(&b, "replay check: %d requests of %s at speedup %s (the dev pool at about %.0f%% of its capacity), engines at --speed %d; load average at start %s\n",
		replayCheckLimit, filepath.Base(trace), sp, 100*replayCheckLoad, replayCheckSpeed, loadAtStart)
	fmt.Fprintf(&b, "  %-20s %12s %12s %12s\n", "column", "lab", "system", "difference")
	for _, col := range lab.ReplayHeader[2:] {
		l, _ := strconv.ParseFloat(labRow[col], 64)
		s, _ := strconv.ParseFloat(sysRow[col], 64)
		diff := fmt.Sprintf("%+.1f", s-l)
		switch {
		case col == "hit_rate":
			diff = fmt.Sprintf("%+.1f points", 100*(s-l))
		case strings.HasSuffix(col, "_ms") && l > 0:
			diff = fmt.Sprintf("%+.0f%%", 100*(s-l)/l)
		}
		fmt.Fprintf(&b, "  %-20s %12s %12s %12s\n", col, labRow[col], sysRow[col], diff)
	}
	fmt.Fprintf(&b, "  the slice's infinite-cache hit rate %.4f; load average at the end %s\n", tr.Bound, loadAverage())
	fmt.Println(b.String())
	lh, _ := strconv.ParseFloat(labRow["hit_rate"], 64)
	sh, _ := strconv.ParseFloat(sysRow["hit_rate"], 64)
	if math.Abs(lh-sh) > replayCheckHitPoints {
		t.Errorf("hit rates differ by %.1f points (lab %.4f, system %.4f); at most %.0f allowed", 100*math.Abs(lh-sh), lh, sh, 100*replayCheckHitPoints)
	}
	if sysRow["refused"] != "0" || labRow["refused"] != "0" {
		t.Logf("refused: lab %s, system %s (at 80%% load none is expected)", labRow["refused"], sysRow["refused"])
	}
}

// runTool runs the binary with args, its output passed through, and fails
// the test when it fails.
func runTool(ctx context.Context, t *testing.T, bin string, args ...string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("switchyard %s: %v", strings.Join(args, " "), err)
	}
}

// startDevProcess runs `switchyard dev` with args on ports of the system's
// choice until the test ends, and returns its gateway's URL once it serves.
func startDevProcess(ctx context.Context, t *testing.T, bin string, args ...string) string {
	t.Helper()
	args = append([]string{"dev", "--listen", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--data", t.TempDir()}, args...)
	// Its own context: the stack runs until the cleanup stops it, and an
	// exit before that, or a failed stop, is the test's failure.
	devCtx, stopDev := context.WithCancel(context.Background())
	cmd := exec.CommandContext(devCtx, bin, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 30 * time.Second
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	urls := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "gateway" {
				select {
				case urls <- f[1]:
				default:
				}
			}
		}
		stopped <- cmd.Wait()
	}()
	t.Cleanup(func() {
		stopDev()
		// A clean exit after the interrupt is Wait's context.Canceled; an
		// exit status or a kill after WaitDelay is not.
		if err := <-stopped; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("switchyard dev did not stop cleanly on an interrupt: %v", err)
		}
	})
	select {
	case u := <-urls:
		return u
	case err := <-stopped:
		stopped <- err // for the cleanup
		t.Fatalf("switchyard dev ended before serving: %v", err)
	case <-ctx.Done():
		t.Fatalf("switchyard dev did not serve: %v", ctx.Err())
	case <-time.After(90 * time.Second):
		t.Fatal("switchyard dev did not serve within 90 s")
	}
	return ""
}

// readArmRow reads arm's row of a replay.csv or a bench-replay.csv.
func readArmRow(t *testing.T, path, arm string) map[string]string {
	t.Helper()
	recs := readCSV(t, path)
	for _, r := range recs[1:] {
		if r[0] == arm {
			row := map[string]string{}
			for i, h := range recs[0] {
				row[h] = r[i]
			}
			return row
		}
	}
	t.Fatalf("%s has no row of arm %s", path, arm)
	return nil
}

// readCSV reads a CSV file with a header and at least one row.
func readCSV(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil || len(recs) < 2 {
		t.Fatalf("%s: %d records, %v; want a header and a row", path, len(recs), err)
	}
	return recs
}
