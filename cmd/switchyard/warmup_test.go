package main

import (
	"bytes"
	"flag"
	"strings"
	"testing"
	"time"
)

// TestWarmUpMeansTheSameOnBrokerAndGateway: --warm-up 0 is "no wait" on
// both parts, and the help of each says so.
func TestWarmUpMeansTheSameOnBrokerAndGateway(t *testing.T) {
	for _, name := range []string{"broker", "gateway"} {
		var out, errb bytes.Buffer
		if code := run(t.Context(), []string{name, "-h"}, &out, &errb); code != 0 {
			t.Fatalf("switchyard %s -h: exit %d", name, code)
		}
		help := out.String()
		i := strings.Index(help, "  -warm-up duration\n")
		if i < 0 {
			t.Fatalf("switchyard %s -h lists no --warm-up duration:\n%s", name, help)
		}
		if line, _, _ := strings.Cut(help[i+len("  -warm-up duration\n"):], "\n"); !strings.Contains(line, "(0: none; at most 1m)") {
			t.Errorf("switchyard %s --warm-up help: %q", name, line)
		}
	}
	for v, want := range map[string]time.Duration{"0": -1, "0s": -1, "3s": 3 * time.Second} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		var d time.Duration
		warmUpVar(fs, &d, "test")
		if err := fs.Parse([]string{"--warm-up", v}); err != nil {
			t.Fatal(err)
		}
		if got := warmUp(d); got != want {
			t.Errorf("--warm-up %s: config %v, want %v", v, got, want)
		}
	}
}
