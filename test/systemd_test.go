package test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// deployFile is one of deploy/systemd's files, read.
func deployFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(), "deploy", "systemd", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var units = []string{"switchyard-gateway.service", "switchyard-broker.service", "switchyard-loader.service", "switchyard-adapter@.service"}

// execStart returns the subcommand and the flags a unit's ExecStart passes.
func execStart(t *testing.T, unit string) (cmd string, flags []string) {
	t.Helper()
	for _, l := range strings.Split(deployFile(t, unit), "\n") {
		rest, ok := strings.CutPrefix(l, "ExecStart=")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 2 || filepath.Base(f[0]) != "switchyard" {
			t.Fatalf("%s: ExecStart runs %q", unit, rest)
		}
		cmd = f[1]
		for _, a := range f[2:] {
			if strings.HasPrefix(a, "-") {
				flags = append(flags, strings.TrimLeft(strings.SplitN(a, "=", 2)[0], "-"))
			}
		}
		return cmd, flags
	}
	t.Fatalf("%s has no ExecStart", unit)
	return "", nil
}

// The units name only flags the binary accepts: each is checked against
// `switchyard <command> -h`, including the adapter flags of the example
// environment file.
func TestSystemdUnitsNameOnlyRealFlags(t *testing.T) {
	helpFlag := regexp.MustCompile(`(?m)^\s+-{1,2}([a-z0-9][a-z0-9-]*)\b`)
	for _, unit := range units {
		cmd, flags := execStart(t, unit)
		if cmd == "adapter" {
			for _, l := range strings.Split(deployFile(t, "adapter.env.example"), "\n") {
				if v, ok := strings.CutPrefix(l, "ADAPTER_FLAGS="); ok {
					for _, a := range strings.Fields(v) {
						if strings.HasPrefix(a, "-") {
							flags = append(flags, strings.TrimLeft(a, "-"))
						}
					}
				}
			}
		}
		out, errOut, code := sy(t, nil, "", cmd, "-h")
		if code != 0 {
			t.Fatalf("switchyard %s -h: exit %d: %s", cmd, code, errOut)
		}
		known := map[string]bool{}
		for _, m := range helpFlag.FindAllStringSubmatch(out+errOut, -1) {
			known[m[1]] = true
		}
		if len(known) == 0 {
			t.Fatalf("switchyard %s -h lists no flags:\n%s%s", cmd, out, errOut)
		}
		for _, f := range flags {
			if !known[f] {
				t.Errorf("%s: switchyard %s has no flag --%s", unit, cmd, f)
			}
		}
	}
}

// Each unit reads its own role's creds file, and the adapter's stop timeout
// outlasts its drain grace.
func TestSystemdUnitsCredsAndDrain(t *testing.T) {
	for unit, creds := range map[string]string{
		"switchyard-gateway.service":  "/etc/switchyard/creds/gateway.creds",
		"switchyard-broker.service":   "/etc/switchyard/creds/broker.creds",
		"switchyard-loader.service":   "/etc/switchyard/creds/loader.creds",
		"switchyard-adapter@.service": "/etc/switchyard/creds/adapter-%i.creds",
	} {
		u := deployFile(t, unit)
		if !strings.Contains(u, "LoadCredential=nats.creds:"+creds+"\n") || !strings.Contains(u, "--creds %d/nats.creds") {
			t.Errorf("%s does not connect with %s", unit, creds)
		}
	}
	u := deployFile(t, "switchyard-adapter@.service")
	grace := regexp.MustCompile(`--drain-grace (\S+)`).FindStringSubmatch(u)
	stop := regexp.MustCompile(`(?m)^TimeoutStopSec=(\d+)$`).FindStringSubmatch(u)
	if grace == nil || stop == nil {
		t.Fatal("the adapter unit sets no --drain-grace or TimeoutStopSec")
	}
	g, err := time.ParseDuration(grace[1])
	s, err2 := time.ParseDuration(stop[1] + "s")
	if err != nil || err2 != nil || s <= g+5*time.Second {
		t.Errorf("TimeoutStopSec=%s does not outlast --drain-grace %s with room to deregister", stop[1], grace[1])
	}
}

// systemd-analyze verify accepts the units (with ExecStart pointing at the
// binary under test, which must exist).
func TestSystemdUnitsVerify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed (apt-get install systemd); the units are not verified")
	}
	dir := t.TempDir()
	for _, unit := range units {
		u := strings.ReplaceAll(deployFile(t, unit), "/usr/local/bin/switchyard", binary(t))
		if err := os.WriteFile(filepath.Join(dir, unit), []byte(u), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, analyze, "verify",
		filepath.Join(dir, "switchyard-gateway.service"),
		filepath.Join(dir, "switchyard-broker.service"),
		filepath.Join(dir, "switchyard-adapter@l70-gen-0.service"))
	out, err := cmd.CombinedOutput()
	// verify exits 0 on unknown keys and bad values too, and says so.
	if err != nil || strings.Contains(string(out), "switchyard") {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}
