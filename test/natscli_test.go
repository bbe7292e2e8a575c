package test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/auth"
	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// natsCLI finds the nats CLI that `make tools` installs (NATS_CLI, then
// .cache/tools/nats, then PATH). Under CI a missing CLI fails the test.
func natsCLI(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("NATS_CLI"); p != "" {
		return p
	}
	if p := filepath.Join(repoRoot(), ".cache", "tools", "nats"); fileExists(p) {
		return p
	}
	if p, err := exec.LookPath("nats"); err == nil {
		return p
	}
	if os.Getenv("CI") != "" {
		t.Fatal("the nats CLI is missing: `make tools` installs it")
	}
	t.Skip("the nats CLI is not installed; run `make tools`")
	return ""
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// runNats runs the CLI against the stack's server as role and returns its
// output; a failure fails the test.
func runNats(t *testing.T, cli string, st *devstack.Stack, role auth.Role, args ...string) string {
	t.Helper()
	out, ok := natsAs(t, cli, st, role, args...)
	if !ok {
		t.Fatalf("nats %s (as %s): %s", strings.Join(args, " "), role.Name(), out)
	}
	return out
}

func TestNatsCLIWorkflows(t *testing.T) {
	cli := natsCLI(t)
	st := startStack(t, devstack.Config{})

	t.Run("kv ls lists the table", func(t *testing.T) {
		out := runNats(t, cli, st, roleObserver, "kv", "ls", "llm-routing")
		for _, k := range []string{"policy", "aliases.chat-large", "aliases.auto", "tenants.acme", "replicas.l70-gen-0"} {
			if !strings.Contains(out, k) {
				t.Errorf("kv ls lacks %s:\n%s", k, out)
			}
		}
	})

	t.Run("micro ls shows the services", func(t *testing.T) {
		out := runNats(t, cli, st, roleOperator, "micro", "ls")
		for _, s := range []string{"switchyard-broker", "switchyard-adapter"} {
			if !strings.Contains(out, s) {
				t.Errorf("micro ls lacks %s:\n%s", s, out)
			}
		}
	})

	t.Run("a chat request straight on NATS", func(t *testing.T) {
		body := `{"model":"chat-small","max_tokens":3,"messages":[{"role":"user","content":"hello from nats req"}]}`
		out := runNats(t, cli, st, tenant("default"), "req", "--raw", "--replies", "0", "--reply-timeout", "2s", "llm.route.default", body)
		// The accept rides on the head here (a fast engine), so the
		// replies are the broker's routed notice and the answer, which
		// names the model as it was asked for.
		if !strings.Contains(out, `"chat.completion"`) || !strings.Contains(out, `"completion_tokens":3`) || !strings.Contains(out, `"model":"chat-small"`) {
			t.Errorf("no chat completion in the replies:\n%s", out)
		}
	})

	t.Run("kv put changes routing", func(t *testing.T) {
		runNats(t, cli, st, roleOperator, "kv", "put", "llm-routing", "aliases.chat-small",
			`{"targets":[{"model":"qwen-coder-32b","version":"v1.0.0","weight":100}]}`)
		testkit.CheckFor(t, 3*time.Second, 50*time.Millisecond, func() error {
			rep := chatReplica(t, st.GatewayURL(), "chat-small")
			if rep != "coder-gen-0" {
				return errors.New("chat-small still served by " + rep)
			}
			return nil
		})
	})
}
