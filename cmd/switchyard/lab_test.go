package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLabReplayRefusesABadTrace: a bad line stops the replay before any
// simulation, naming the file and the line; bad replay flags are usage
// errors.
func TestLabReplayRefusesABadTrace(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "trace.jsonl")
	ok := `{"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]}` + "\n"
	if err := os.WriteFile(trace, []byte(ok+ok+`{"timestamp": 5, "input_length": "many", "output_length": 1, "hash_ids": []}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := run(t.Context(), []string{"lab", "replay", "--trace", trace, "--out", dir}, &out, &errb); code == 0 ||
		!strings.Contains(errb.String(), trace+": line 3: input_length is not a number") {
		t.Errorf("exit %d, stderr %q", code, errb.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "report.md")); err == nil {
		t.Error("a report was written for a bad trace")
	}
	for _, args := range [][]string{
		{"lab", "replay", "--trace", trace, "--speedups", "2,fast"},
		{"lab", "replay", "--trace", trace, "--format", "sharegpt"},
		{"lab", "threshold", "--trace", trace},
		{"lab", "threshold", "--limit", "5"},
	} {
		out.Reset()
		errb.Reset()
		if code := run(t.Context(), args, &out, &errb); code != exitUsage {
			t.Errorf("%v: exit %d, want %d (stderr %q)", args, code, exitUsage, errb.String())
		}
	}
}
