package test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

var natsServerOnce struct {
	sync.Once
	path string
	err  error
}

// natsServerBinary finds the nats-server that `make tools` builds from the
// module in go.mod (NATS_SERVER, then .cache/tools/nats-server), or builds
// it once for this run.
func natsServerBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("NATS_SERVER"); p != "" {
		return p
	}
	root := repoRoot()
	if p := filepath.Join(root, ".cache", "tools", "nats-server"); fileExists(p) {
		return p
	}
	natsServerOnce.Do(func() {
		dir, err := os.MkdirTemp("", "nats-server-bin")
		if err != nil {
			natsServerOnce.err = err
			return
		}
		natsServerOnce.path = filepath.Join(dir, "nats-server")
		cmd := exec.Command("go", "build", "-o", natsServerOnce.path, "github.com/nats-io/nats-server/v2")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			natsServerOnce.err = fmt.Errorf("%v: %s", err, out)
		}
	})
	if natsServerOnce.err != nil {
		t.Fatalf("build nats-server: %v", natsServerOnce.err)
	}
	return natsServerOnce.path
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..")
}

// bareNATS runs `nats-server -js` as its own process on a free loopback port,
// stopped when the test ends, and returns its URL.
func bareNATS(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command(natsServerBinary(t), "-js", "-a", "127.0.0.1", "-p", "-1", "-sd", filepath.Join(dir, "js"), "--ports_file_dir", dir)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	})
	portsFile := filepath.Join(dir, fmt.Sprintf("nats-server_%d.ports", cmd.Process.Pid))
	var ports struct {
		Nats []string `json:"nats"`
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, err := os.ReadFile(portsFile)
		if err == nil && json.Unmarshal(b, &ports) == nil && len(ports.Nats) > 0 {
			return ports.Nats[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("nats-server wrote no ports file: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A new user's first steps: a bare `nats-server -js`, then the table.
func TestTableImportBootstrapsABareServer(t *testing.T) {
	url := bareNATS(t)
	env := []string{"NATS_URL=" + url}
	table := filepath.Join(repoRoot(), "deploy", "examples", "table.json")

	out, errOut, code := sy(t, env, "", "table", "import", table)
	if code != 0 || !strings.Contains(out, "created 21,") {
		t.Fatalf("import on a bare server: exit %d: %s%s", code, out, errOut)
	}
	out, errOut, code = sy(t, env, "", "table", "init", "--replicas", "3")
	if code != 0 || !strings.Contains(out, "bucket llm-routing exists: 1 replicas, 16 revisions per key, 21 keys") {
		t.Errorf("init on the imported bucket: exit %d: %s%s", code, out, errOut)
	}
	out, _, code = sy(t, env, "", "table", "import", table)
	if code != 0 || !strings.Contains(out, "unchanged 21") {
		t.Errorf("second import: exit %d: %s", code, out)
	}
	out, _, code = sy(t, env, "", "table", "get", "aliases.chat-large")
	if code != 0 || !strings.Contains(out, "llama-3-70b-instruct") {
		t.Errorf("get after import: exit %d: %s", code, out)
	}

	out, errOut, code = sy(t, env, "", "table", "init", "--bucket", "other")
	if code != 0 || !strings.Contains(out, "bucket other created: 1 replicas, 16 revisions per key, 0 keys") {
		t.Errorf("init of a new bucket: exit %d: %s%s", code, out, errOut)
	}
	// One server cannot hold three replicas: the error is JetStream's, exit 1.
	_, errOut, code = sy(t, env, "", "table", "init", "--bucket", "three", "--replicas", "3")
	if code != 1 || !strings.Contains(errOut, "bucket three") {
		t.Errorf("three replicas on one server: exit %d: %s", code, errOut)
	}
	_, _, code = sy(t, env, "", "table", "init", "--replicas", "9")
	if code != 2 {
		t.Errorf("--replicas 9: exit %d, want 2", code)
	}
	_, _, code = sy(t, env, "", "table", "get", "policy", "--replicas", "3")
	if code != 2 {
		t.Errorf("--replicas on get: exit %d, want 2", code)
	}
	// A bad file is refused before the bucket is touched.
	bad := filepath.Join(t.TempDir(), "bad.json")
	_ = os.WriteFile(bad, []byte(`{"policy":{"saturation_kv":3}}`), 0o644)
	_, errOut, code = sy(t, env, "", "table", "import", "--bucket", "untouched", bad)
	if code != 1 || !strings.Contains(errOut, "policy: saturation_kv") {
		t.Errorf("bad import: exit %d: %s", code, errOut)
	}
	_, errOut, code = sy(t, env, "", "table", "get", "--bucket", "untouched", "policy")
	if code != 1 || !strings.Contains(errOut, "bucket not found") {
		t.Errorf("a refused import created its bucket: exit %d: %s", code, errOut)
	}
}

func TestVersion(t *testing.T) {
	out, _, code := sy(t, nil, "", "version")
	if code != 0 || !strings.HasPrefix(out, "switchyard ") || !strings.Contains(out, runtime.Version()) {
		t.Errorf("version: exit %d: %q", code, out)
	}
	out2, _, code := sy(t, nil, "", "--version")
	if code != 0 || out2 != out {
		t.Errorf("--version: exit %d: %q, want %q", code, out2, out)
	}
	js, _, code := sy(t, nil, "", "version", "--json")
	var v struct {
		Version, Revision string
		GoVersion         string `json:"go_version"`
	}
	if err := json.Unmarshal([]byte(js), &v); code != 0 || err != nil || v.GoVersion != runtime.Version() || !strings.Contains(out, v.Version) {
		t.Errorf("version --json: exit %d: %q (%v)", code, js, err)
	}
}
