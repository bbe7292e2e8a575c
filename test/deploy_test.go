package test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/switchyard-llm/switchyard/deploy/examples"
	"github.com/switchyard-llm/switchyard/internal/testkit"
)

var natsServerBin built

// natsServerBinary finds the nats-server that `make tools` builds from the
// module in go.mod (NATS_SERVER, then .cache/tools/nats-server), or builds
// it once for this run.
func natsServerBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("NATS_SERVER"); p != "" {
		return p
	}
	if p := filepath.Join(repoRoot(), ".cache", "tools", "nats-server"); fileExists(p) {
		return p
	}
	return natsServerBin.build(t, "nats-server", "github.com/nats-io/nats-server/v2")
}

func bareNATS(t *testing.T) string {
	t.Helper()
	_, url := testkit.StartNATSServer(t, natsServerBinary(t), "-js", "-sd", filepath.Join(t.TempDir(), "js"))
	return url
}

// A new user's first steps: a bare `nats-server -js`, then the table.
func TestTableImportBootstrapsABareServer(t *testing.T) {
	url := bareNATS(t)
	env := []string{"NATS_URL=" + url}
	table := filepath.Join(repoRoot(), "deploy", "examples", "table.json")

	n := strconv.Itoa(len(examples.Flat())) // entries of the dev table
	out, errOut, code := sy(t, env, "", "table", "import", table)
	if code != 0 || !strings.Contains(out, "created "+n+",") {
		t.Fatalf("import on a bare server: exit %d: %s%s", code, out, errOut)
	}
	out, errOut, code = sy(t, env, "", "table", "init", "--replicas", "3")
	if code != 0 || !strings.Contains(out, "bucket llm-routing exists: 1 replicas, 16 revisions per key, "+n+" keys") {
		t.Errorf("init on the imported bucket: exit %d: %s%s", code, out, errOut)
	}
	out, _, code = sy(t, env, "", "table", "import", table)
	if code != 0 || !strings.Contains(out, "unchanged "+n) {
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

// The node and site files as shipped, on this machine: each of node-1.conf …
// node-3.conf with cluster.conf, and site-1.conf with leaf-gpu-site.conf,
// pass `nats-server -t` once /etc/nats and /var/lib/nats stand for a
// directory holding certificates from make-certs.sh and what `switchyard
// auth init` writes; so do region-eu-1.conf and region-us-1.conf with
// supercluster.conf. (make cluster runs cluster.conf and leaf-gpu-site.conf
// with loopback addresses.)
func TestShippedNATSConfigsCheck(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("openssl is not installed; make-certs.sh needs it")
	}
	src := filepath.Join(repoRoot(), "deploy", "nats")
	dir := t.TempDir()
	etc := filepath.Join(dir, "etc")
	mk := exec.Command(filepath.Join(src, "make-certs.sh"), filepath.Join(etc, "tls"), "nats-1", "nats-2", "nats-3", "nats-eu-1", "nats-us-1")
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("make-certs.sh: %v\n%s", err, out)
	}
	authDir := filepath.Join(dir, "auth")
	if out, errOut, code := sy(t, nil, "", "auth", "init", authDir, "--replicas", "coder-gen-0"); code != 0 {
		t.Fatalf("auth init: exit %d: %s%s", code, out, errOut)
	}
	local := func(b []byte) []byte {
		s := strings.ReplaceAll(string(b), "/etc/nats/", etc+"/")
		return []byte(strings.ReplaceAll(s, "/var/lib/nats/", filepath.Join(dir, "var")+"/"))
	}
	copyTo := func(from, to string) {
		t.Helper()
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, local(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	check := func(conf string) {
		t.Helper()
		out, err := exec.Command(natsServerBinary(t), "-c", conf, "-t").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "is valid") {
			t.Errorf("nats-server -t %s: %v\n%s", conf, err, out)
		}
	}
	for i := 1; i <= 3; i++ {
		node := filepath.Join(dir, fmt.Sprintf("nats-%d", i))
		copyTo(filepath.Join(src, "cluster.conf"), filepath.Join(node, "cluster.conf"))
		copyTo(filepath.Join(src, fmt.Sprintf("node-%d.conf", i)), filepath.Join(node, "node.conf"))
		copyTo(filepath.Join(authDir, "server.conf"), filepath.Join(node, "switchyard", "server.conf"))
		if err := os.WriteFile(filepath.Join(node, "switchyard", "leafnodes.conf"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		check(filepath.Join(node, "cluster.conf"))
	}
	// A region of a supercluster: supercluster.conf includes cluster.conf.
	for _, region := range []string{"eu", "us"} {
		node := filepath.Join(dir, "nats-"+region+"-1")
		copyTo(filepath.Join(src, "supercluster.conf"), filepath.Join(node, "supercluster.conf"))
		copyTo(filepath.Join(src, "cluster.conf"), filepath.Join(node, "cluster.conf"))
		copyTo(filepath.Join(src, "region-"+region+"-1.conf"), filepath.Join(node, "node.conf"))
		copyTo(filepath.Join(authDir, "server.conf"), filepath.Join(node, "switchyard", "server.conf"))
		if err := os.WriteFile(filepath.Join(node, "switchyard", "leafnodes.conf"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		check(filepath.Join(node, "supercluster.conf"))
	}
	site := filepath.Join(dir, "site")
	copyTo(filepath.Join(src, "leaf-gpu-site.conf"), filepath.Join(site, "leaf-gpu-site.conf"))
	copyTo(filepath.Join(src, "site-1.conf"), filepath.Join(site, "site.conf"))
	copyTo(filepath.Join(authDir, "creds", "adapter-coder-gen-0.creds"), filepath.Join(etc, "adapter-coder-gen-0.creds"))
	check(filepath.Join(site, "leaf-gpu-site.conf"))
}
