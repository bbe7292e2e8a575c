package main

import (
	"bufio"
	"bytes"
	"context"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/internal/testkit"
)

type helpEntry struct{ name, kind string }

// help runs `switchyard NAME -h` and returns the flags it prints.
func help(t *testing.T, name string) []helpEntry {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(t.Context(), []string{name, "-h"}, &out, &errb); code != 0 {
		t.Fatalf("switchyard %s -h: exit %d, stderr %q", name, code, errb.String())
	}
	if !strings.HasPrefix(out.String(), "usage: switchyard "+name) {
		t.Fatalf("switchyard %s -h does not start with its synopsis:\n%s", name, out.String())
	}
	// A flag line of PrintDefaults is "  -name type".
	helpFlag := regexp.MustCompile(`^  -([a-z0-9-]+)(?: (\w+))?$`)
	var flags []helpEntry
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		if m := helpFlag.FindStringSubmatch(sc.Text()); m != nil {
			flags = append(flags, helpEntry{m[1], m[2]})
		}
	}
	return flags
}

func TestEveryCommandHasHelp(t *testing.T) {
	for _, c := range commands() {
		t.Run(c.name, func(t *testing.T) {
			flags := help(t, c.name)
			if len(flags) == 0 {
				t.Fatalf("switchyard %s -h lists no flags", c.name)
			}
			var out, errb bytes.Buffer
			if code := run(t.Context(), []string{c.name, "--help"}, &out, &errb); code != 0 || !strings.Contains(out.String(), c.usage) {
				t.Errorf("switchyard %s --help: exit %d, stdout %q", c.name, code, out.String())
			}
		})
	}
}

// TestNumericFlagsRefuseOutOfRange feeds every numeric or size flag that
// `-h` lists an out-of-range value: the command exits 2 at once, naming the
// flag, and never connects to the NATS server it was pointed at.
func TestNumericFlagsRefuseOutOfRange(t *testing.T) {
	// A listener standing in for NATS counts who tries to reach it.
	ln := testkit.Listen(t)
	var dialed atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			dialed.Add(1)
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	natsURL := "nats://" + ln.Addr().String()
	t.Setenv("NATS_URL", natsURL)

	// Out-of-range values for each kind of numeric flag: below and above
	// what any accepts. Unsigned flags have no ceiling.
	badValues := map[string][]string{
		"int":      {"-1", "1000000000000"},
		"float":    {"-1", "1e300", "NaN"},
		"duration": {"-1s", "1000000h"},
		"size":     {"-1", "64GiB"},
		"uint":     {"-1"},
	}

	tested := 0
	for _, c := range commands() {
		flags := help(t, c.name)
		// Harmless values for the flags that would bind or write, had the
		// command gone ahead by mistake.
		var base []string
		for _, f := range flags {
			switch f.name {
			case "nats":
				base = append(base, "--nats", natsURL)
			case "listen", "metrics-listen", "admin-listen":
				base = append(base, "--"+f.name, "127.0.0.1:0")
			case "nats-listen":
				base = append(base, "--"+f.name, "127.0.0.1:-1")
			case "data", "out", "state-dir":
				base = append(base, "--"+f.name, t.TempDir())
			}
		}
		for _, f := range flags {
			for _, v := range badValues[f.kind] {
				tested++
				t.Run(c.name+"/"+f.name+"="+v, func(t *testing.T) {
					ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
					defer cancel()
					var out, errb bytes.Buffer
					start := time.Now()
					code := run(ctx, append(append([]string{c.name}, base...), "--"+f.name, v), &out, &errb)
					took := time.Since(start)
					if code != exitUsage {
						t.Errorf("exit %d, want %d; stderr %q", code, exitUsage, errb.String())
					}
					if !strings.Contains(errb.String(), "-"+f.name) {
						t.Errorf("stderr does not name -%s: %q", f.name, errb.String())
					}
					// A command that started would run until ctx ends; a
					// refused flag returns before it does, however loaded
					// the machine.
					if ctx.Err() != nil {
						t.Errorf("took %v to refuse: the command ran until its context ended", took)
					}
				})
			}
		}
	}
	if tested < 20 {
		t.Errorf("only %d out-of-range cases found in the commands' help", tested)
	}
	if n := dialed.Load(); n != 0 {
		t.Errorf("%d connections reached the NATS address", n)
	}
}

// TestGatewayListenerFlags: the admin listener cannot be turned into the
// public one, and a certificate that cannot be used stops the gateway
// before it connects.
func TestGatewayListenerFlags(t *testing.T) {
	base := []string{"gateway", "--nats", "nats://127.0.0.1:1", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}
	for name, tc := range map[string]struct {
		args []string
		flag string // the flag the refusal names
	}{
		"no admin listener":       {[]string{"--admin-listen", ""}, "--admin-listen"},
		"a certificate, no key":   {[]string{"--tls-cert", "cert.pem"}, "--tls-key"},
		"a certificate not there": {[]string{"--tls-cert", t.TempDir() + "/cert.pem", "--tls-key", t.TempDir() + "/key.pem"}, "--tls-cert"},
	} {
		t.Run(name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(t.Context(), append(append([]string{}, base...), tc.args...), &out, &errb); code != exitUsage || !strings.Contains(errb.String(), tc.flag) {
				t.Errorf("exit %d, want %d naming %s; stderr %q", code, exitUsage, tc.flag, errb.String())
			}
		})
	}
}

// TestRegionFlag: a --region that is not a token is refused by every part
// that takes one, naming the flag, before anything connects.
func TestRegionFlag(t *testing.T) {
	for _, args := range [][]string{
		{"broker", "--nats", "nats://127.0.0.1:1", "--metrics-listen", "127.0.0.1:0", "--state-dir", t.TempDir()},
		{"gateway", "--nats", "nats://127.0.0.1:1", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"},
		{"adapter", "--nats", "nats://127.0.0.1:1", "--engine", "http://127.0.0.1:1", "--replica", "r-1", "--model", "m"},
	} {
		t.Run(args[0], func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(t.Context(), append(args, "--region", "eu.west"), &out, &errb); code != exitUsage || !strings.Contains(errb.String(), "region") {
				t.Errorf("exit %d, want %d naming --region; stderr %q", code, exitUsage, errb.String())
			}
		})
	}
}
