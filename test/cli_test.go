package test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/auth"
	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// built is a binary the tests build from this module once per run.
type built struct {
	sync.Once
	path string
	err  error
}

func (b *built) build(t *testing.T, name, pkg string) string {
	t.Helper()
	b.Do(func() {
		dir, err := os.MkdirTemp("", name+"-bin")
		if err != nil {
			b.err = err
			return
		}
		b.path, b.err = goBuild(dir, name, pkg)
	})
	if b.err != nil {
		t.Fatalf("build %s: %v", pkg, b.err)
	}
	return b.path
}

// goBuild builds the package pkg of this module as dir/name.
func goBuild(dir, name, pkg string) (string, error) {
	path := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-o", path, pkg)
	cmd.Dir = repoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%v: %s", err, out)
	}
	return path, nil
}

var switchyardBin built

// binary builds cmd/switchyard once per test run.
func binary(t *testing.T) string {
	t.Helper()
	return switchyardBin.build(t, "switchyard", "./cmd/switchyard")
}

// repoRoot is the module's directory.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..")
}

// sy runs the binary and returns stdout, stderr and the exit code.
func sy(t *testing.T, env []string, stdin string, args ...string) (string, string, int) {
	t.Helper()
	// The binary is built (once, and slowly on a busy machine) before the
	// command's own 30 s start: the build is not the command's time.
	bin := binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

func TestTableValidateOffline(t *testing.T) {
	good := filepath.Join(repoRoot(), "deploy", "examples", "table.json")
	out, _, code := sy(t, nil, "", "table", "validate", good)
	if code != 0 || !strings.Contains(out, "all valid") {
		t.Errorf("validate dev table: exit %d: %s", code, out)
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	_ = os.WriteFile(bad, []byte(`{"aliases.x":{"targets":[{"model":"m","weight":-1}]},"policy":{"saturation_kv":3}}`), 0o644)
	_, errOut, code := sy(t, nil, "", "table", "validate", bad)
	if code != 1 || !strings.Contains(errOut, "aliases.x: targets[0].weight") || !strings.Contains(errOut, "policy: saturation_kv") {
		t.Errorf("validate bad table: exit %d, stderr %q", code, errOut)
	}
	// The replica choice's profile and scorers: an unknown profile, an
	// unknown scorer and a negative weight, each refused with its key.
	_ = os.WriteFile(bad, []byte(`{"policy":{"profile":"aibrix"},"pools.general":{"scorers":{"gpu_temp":1}},"pools.premium":{"scorers":{"kv_usage":-1}}}`), 0o644)
	_, errOut, code = sy(t, nil, "", "table", "validate", bad)
	for _, want := range []string{`policy: profile: unknown profile "aibrix"`, `pools.general: scorers: unknown scorer "gpu_temp"`, "pools.premium: scorers.kv_usage: "} {
		if code != 1 || !strings.Contains(errOut, want) {
			t.Errorf("validate bad profile: exit %d, stderr %q lacks %q", code, errOut, want)
		}
	}
	if _, _, code := sy(t, nil, "", "table", "frobnicate"); code != 2 {
		t.Errorf("bad usage: exit %d, want 2", code)
	}
	if _, _, code := sy(t, nil, "", "nosuchcommand"); code != 2 {
		t.Errorf("unknown command: exit %d, want 2", code)
	}
}

func TestTableCommandsAgainstTheBucket(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed("l8-gen-0")})
	env := []string{"NATS_URL=" + st.NATSURL(), "NATS_CREDS=" + st.Creds(auth.Role{Kind: auth.RoleOperator}), "HOME=" + t.TempDir()}

	out, _, code := sy(t, env, "", "table", "get", "aliases.chat-small")
	if code != 0 || !strings.Contains(out, "llama-3-8b-instruct") {
		t.Fatalf("get: exit %d: %s", code, out)
	}

	// put refuses an invalid value and keeps the old one.
	_, errOut, code := sy(t, env, `{"targets":"nope"}`, "table", "put", "aliases.chat-small", "-")
	if code != 1 || !strings.Contains(errOut, "aliases.chat-small") {
		t.Errorf("invalid put: exit %d, %s", code, errOut)
	}
	if out, _, _ := sy(t, env, "", "table", "get", "aliases.chat-small"); !strings.Contains(out, "llama-3-8b-instruct") {
		t.Errorf("invalid put changed the value: %s", out)
	}

	// put refuses an unknown profile, naming the key.
	_, errOut, code = sy(t, env, `{"profile":"least-request"}`, "table", "put", "pools.general", "-")
	if code != 1 || !strings.Contains(errOut, `pools.general: profile: unknown profile "least-request"`) {
		t.Errorf("put of an unknown profile: exit %d, %s", code, errOut)
	}

	// edit with a scripted editor, then history and rollback.
	out, errOut, code = sy(t, append(env, "EDITOR=sed -i s/llama-3-8b-instruct/qwen-coder-32b/"), "", "table", "edit", "aliases.chat-small")
	if code != 0 || !strings.Contains(out, "stored at revision") {
		t.Fatalf("edit: exit %d: %s %s", code, out, errOut)
	}
	_, errOut, code = sy(t, append(env, "EDITOR=sed -i s/weight/wait/"), "", "table", "edit", "aliases.chat-small")
	if code != 1 || !strings.Contains(errOut, "refused") {
		t.Errorf("an invalid edit must be refused: exit %d: %s", code, errOut)
	}
	out, _, code = sy(t, env, "", "table", "history", "aliases.chat-small")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 2 || !strings.Contains(lines[1], "qwen-coder-32b") {
		t.Fatalf("history: exit %d: %s", code, out)
	}
	firstRev := strings.Fields(lines[0])[1]
	out, _, code = sy(t, env, "", "table", "rollback", "aliases.chat-small", firstRev)
	if code != 0 || !strings.Contains(out, "rolled back") {
		t.Fatalf("rollback: exit %d: %s", code, out)
	}
	if out, _, _ := sy(t, env, "", "table", "get", "aliases.chat-small"); !strings.Contains(out, "llama-3-8b-instruct") {
		t.Errorf("rollback did not restore the value: %s", out)
	}

	// export → import round trip reports nothing changed.
	exported, _, code := sy(t, env, "", "table", "export")
	if code != 0 || !strings.Contains(exported, `"aliases.auto"`) {
		t.Fatalf("export: exit %d: %s", code, exported)
	}
	f := filepath.Join(t.TempDir(), "t.json")
	_ = os.WriteFile(f, []byte(exported), 0o644)
	out, errOut, code = sy(t, env, "", "table", "import", f)
	if code != 0 {
		t.Fatalf("import: exit %d: %s %s", code, out, errOut)
	}
	t.Logf("import report: %s", strings.TrimSpace(out))
}

func TestKeyAddAndExplain(t *testing.T) {
	eachDecider(t, func(t *testing.T, decide string) {
		st := startStack(t, devstack.Config{Gateway: gateway.Config{Decide: decide}, Replicas: devstack.ReplicasNamed("l70-gen-0", "l70-gen-1", "l70-long-0", "l70-prem-0", "coder-gen-0")})
		env := []string{"NATS_URL=" + st.NATSURL(), "NATS_CREDS=" + st.Creds(auth.Role{Kind: auth.RoleOperator}), "HOME=" + t.TempDir()}
		out, _, code := sy(t, env, "", "key", "add", "--tenant", "acme")
		key := strings.TrimSpace(out)
		if code != 0 || !strings.HasPrefix(key, "sk-") {
			t.Fatalf("key add: exit %d: %q", code, out)
		}
		// The new key speaks for acme (premium) once the gateway has the table.
		body := `{"model":"chat-large","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`
		testkit.CheckFor(t, 3*time.Second, 50*time.Millisecond, func() error {
			status, h := post(t, st.GatewayURL(), key, body)
			if status != 200 || h.Get("X-Switchyard-Pool") != "premium" {
				return errors.New("pool " + h.Get("X-Switchyard-Pool"))
			}
			return nil
		})

		// Anonymous access is on in dev, yet a key that is not in the table is
		// refused; sk-default-dev is tenant default, for SDKs that need a key.
		for key, want := range map[string]int{"sk-acme-dve": 401, "sk-default-dev": 200, "": 200} {
			if status, _ := post(t, st.GatewayURL(), key, body); status != want {
				t.Errorf("key %q: %d, want %d", key, status, want)
			}
		}

		// key list shows a key by a prefix of its hash, its tenant and when it
		// was added; revoke takes that id. Both run with the operator's creds.
		sum := sha256.Sum256([]byte(key))
		hash := hex.EncodeToString(sum[:])
		id := hash[:12]
		out, _, code = sy(t, env, "", "key", "list")
		if code != 0 || !regexp.MustCompile(`(?m)^`+id+` +acme +20\d\d-`).MatchString(out) || strings.Contains(out, hash) || !strings.Contains(out, "default") {
			t.Fatalf("key list: exit %d:\n%s", code, out)
		}
		if out, _, code = sy(t, env, "", "key", "list", "--tenant", "trial"); code != 0 || strings.Contains(out, id) || !strings.Contains(out, "trial") {
			t.Errorf("key list --tenant trial: exit %d:\n%s", code, out)
		}
		if out, errOut, code := sy(t, env, "", "key", "revoke", id); code != 0 || !strings.Contains(out, "revoked "+id) {
			t.Fatalf("key revoke: exit %d: %s %s", code, out, errOut)
		}
		testkit.CheckFor(t, 3*time.Second, 50*time.Millisecond, func() error {
			status, _ := post(t, st.GatewayURL(), key, body)
			if status != 401 {
				return errors.New("a revoked key answers " + strconv.Itoa(status))
			}
			return nil
		})
		if out, _, _ := sy(t, env, "", "key", "list"); strings.Contains(out, id) {
			t.Errorf("key list after revoke still shows %s:\n%s", id, out)
		}
		if _, _, code := sy(t, env, "", "key", "revoke", id); code != 1 {
			t.Errorf("revoking it again: exit %d, want 1", code)
		}
		if _, _, code := sy(t, env, "", "key", "revoke", "not-hex"); code != 2 {
			t.Errorf("key revoke not-hex: exit %d, want 2", code)
		}

		out, _, code = sy(t, env, "", "explain", "--model", "chat-large", "--prompt-tokens", "20000")
		if code != 0 || !strings.Contains(out, "long-context") || !strings.Contains(out, "l70-long-0") {
			t.Errorf("explain long prompt: exit %d: %s", code, out)
		}
		out, _, code = sy(t, env, "", "explain", "--tenant", "intern", "--model", "chat-large")
		if code != 1 || !strings.Contains(out, "model_not_allowed") {
			t.Errorf("explain restricted: exit %d: %s", code, out)
		}
		// A read-only identity is told it may not ask, not that no broker answered.
		observer := []string{"NATS_URL=" + st.NATSURL(), "NATS_CREDS=" + st.Creds(auth.Role{Kind: auth.RoleObserver}), "HOME=" + t.TempDir()}
		if _, errOut, code := sy(t, observer, "", "explain", "--model", "chat-large"); code != 1 || !strings.Contains(errOut, "may not publish llm.explain.default") {
			t.Errorf("explain as observer: exit %d: %s", code, errOut)
		}
		if _, _, code := sy(t, env, "", "explain"); code != 2 {
			t.Errorf("explain without --model: exit %d, want 2", code)
		}
		// The coder replica's engine serves the Messages API, not Responses.
		out, _, code = sy(t, env, "", "explain", "--model", "qwen-coder-32b", "--endpoint", "responses")
		if code != 1 || !strings.Contains(out, "501 endpoint_not_supported") {
			t.Errorf("explain --endpoint responses: exit %d: %s", code, out)
		}
		out, _, code = sy(t, env, "", "explain", "--model", "qwen-coder-32b", "--endpoint", "messages")
		if code != 0 || !strings.Contains(out, "coder-gen-0") {
			t.Errorf("explain --endpoint messages: exit %d: %s", code, out)
		}
		if _, _, code := sy(t, env, "", "explain", "--model", "chat-large", "--endpoint", "assistants"); code != 2 {
			t.Errorf("explain --endpoint assistants: exit %d, want 2", code)
		}
	})
}
