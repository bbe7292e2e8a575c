package test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/lab"
)

// switchyard bench --trace replays a trace through the dev stack: every
// request is served, and the engines report the cache hits the trace's
// shared hash ids imply (equal ids made equal text), at least half the
// trace's infinite-cache hit rate, in bench-replay.csv's system row.
func TestBenchTraceReplaysThroughDev(t *testing.T) {
	const n = 80
	trace := lab.ConversationTrace(n, 7)
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(path, trace, 0o600); err != nil {
		t.Fatal(err)
	}
	tr, err := lab.LoadTrace(lab.ReplayConfig{Name: path, R: bytes.NewReader(trace)}, lab.Options{Scale: lab.Full})
	if err != nil {
		t.Fatal(err)
	}
	st := startStack(t, devstack.Config{Speed: 8, Replicas: devstack.ReplicasNamed("l8-gen-0", "l8-gen-1")})
	out := t.TempDir()
	stdout, stderr, code := sy(t, nil, "", "bench", "--trace", path, "--target", st.GatewayURL(), "--model", lab.DevReplayModel,
		"--api-key", "sk-default-dev", "--speedup", "4", "--out", out, "--quiet")
	if code != 0 {
		t.Fatalf("bench --trace: exit %d\n%s\n%s", code, stdout, stderr)
	}
	row := readArmRow(t, filepath.Join(out, "bench-replay.csv"), "system")
	if rows := len(readCSV(t, filepath.Join(out, "bench-replay.csv"))); rows != 2 {
		t.Errorf("bench-replay.csv has %d records, want a header and one row", rows)
	}
	if row["requests"] != strconv.Itoa(n) || row["refused"] != "0" {
		t.Fatalf("bench-replay.csv: %v\n%s", row, stdout)
	}
	hit, _ := strconv.ParseFloat(row["hit_rate"], 64)
	if hit < tr.Bound/2 {
		t.Errorf("hit rate %.3f, want at least half the trace's bound %.3f\n%s", hit, tr.Bound, stdout)
	}
	if strings.Contains(stdout, "reported no cached tokens") {
		t.Errorf("the simulated engines report cached tokens:\n%s", stdout)
	}
	t.Logf("hit rate %.3f (bound %.3f)\n%s", hit, tr.Bound, stdout)
}

// A bad trace is refused as lab replay refuses it, naming the line, before
// any request is sent; so are flags that do not go with --trace.
func TestBenchTraceRefusesBadInputBeforeSending(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { hits.Add(1) }))
	defer srv.Close()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonl")
	good := `{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}` + "\n"
	if err := os.WriteFile(bad, []byte(good+`{"timestamp": 5, "input_length": -3, "output_length": 2}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, labErr, labCode := sy(t, nil, "", "lab", "replay", "--trace", bad, "--out", dir)
	_, benchErr, code := sy(t, nil, "", "bench", "--trace", bad, "--target", srv.URL)
	if code == 0 || !strings.Contains(benchErr, "line 2") {
		t.Errorf("bad trace: exit %d, stderr %q; want a failure naming line 2", code, benchErr)
	}
	if labCode == 0 || benchErr[strings.Index(benchErr, ":")+1:] != labErr[strings.Index(labErr, ":")+1:] {
		t.Errorf("bench said %q, lab replay %q: want the same refusal", benchErr, labErr)
	}
	for _, args := range [][]string{{"--rate", "5"}, {"--speedup", "0"}, {"--block-tokens", "0"}, {"--max-inflight", "0"}, {"--format", "csv"}} {
		_, e, c := sy(t, nil, "", append([]string{"bench", "--trace", bad, "--target", srv.URL}, args...)...)
		if c != 2 {
			t.Errorf("%v: exit %d, stderr %q; want a usage error", args, c, e)
		}
	}
	if _, e, c := sy(t, nil, "", "bench", "--target", srv.URL, "--speedup", "2"); c != 2 || !strings.Contains(e, "--trace") {
		t.Errorf("--speedup without --trace: exit %d, stderr %q", c, e)
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("%d requests reached the target; a refusal sends none", n)
	}
}

// bench --trace exits 0 when the replay ran, whatever the answers: a
// gateway that refuses every request gives a row of refusals, not a
// failed command.
func TestBenchTraceExitsZeroWhateverTheAnswers(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"error":{"message":"no replica","type":"server_error","code":"no_replicas"}}`))
	}))
	defer srv.Close()
	dir := t.TempDir()
	path := filepath.Join(dir, "trace.jsonl")
	if err := os.WriteFile(path, lab.ConversationTrace(5, 3), 0o600); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := sy(t, nil, "", "bench", "--trace", path, "--target", srv.URL, "--speedup", "100", "--out", dir, "--quiet")
	if code != 0 {
		t.Fatalf("exit %d with every answer refused, want 0\n%s\n%s", code, stdout, stderr)
	}
	row := readArmRow(t, filepath.Join(dir, "bench-replay.csv"), "system")
	if row["requests"] != "5" || row["refused"] != "5" || hits.Load() != 5 || !strings.Contains(stdout, "503 no_replicas") {
		t.Errorf("row %v, %d requests reached the target; stdout:\n%s", row, hits.Load(), stdout)
	}
}
