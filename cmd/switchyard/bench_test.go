package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The workload options are checked before anything is sent: a file without
// timestamps needs --rate, and a malformed shape names its flag.
func TestBenchRefusesBadWorkloadOptions(t *testing.T) {
	dir := t.TempDir()
	untimed := filepath.Join(dir, "untimed.jsonl")
	if err := os.WriteFile(untimed, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--workload", untimed}, "give --rate"},
		{[]string{"--workload", filepath.Join(dir, "missing.jsonl")}, "--workload"},
		{[]string{"--shared-prefix", "8"}, "shared-prefix"},
		{[]string{"--prompt-bytes", "9-3"}, "prompt-bytes"},
		{[]string{"--workload", untimed, "--rate", "5", "--prompt-bytes", "100"}, "do not apply"},
	}
	for _, c := range cases {
		var out, errb bytes.Buffer
		args := append([]string{"bench", "--target", "http://127.0.0.1:9"}, c.args...)
		if code := run(t.Context(), args, &out, &errb); code != exitUsage || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d naming %q", c.args, code, errb.String(), exitUsage, c.want)
		}
	}
}
