package test

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// `make cluster` is the production shape as separate processes: each printed
// gateway routes (the headers say how), also to the replica behind the GPU
// site's leaf node, every part reports its build, and a
// Ctrl-C to make's process group leaves no process behind.
func TestMakeClusterRunsAndStopsClean(t *testing.T) {
	if testing.Short() {
		t.Skip("starts about 25 processes")
	}
	makeBin, err := exec.LookPath("make")
	if err != nil {
		t.Skip("make is not installed")
	}
	dir := t.TempDir()
	cmd := exec.Command(makeBin, "--no-print-directory", "-C", repoRoot(), "cluster", "CLUSTER_DIR="+dir, "NATS_SERVER="+natsServerBinary(t))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // the group a terminal's Ctrl-C reaches
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// One goroutine reads make's output to EOF, then waits for it: exited
	// says make is gone, whatever the test does meanwhile.
	lines, quit, exited := make(chan string), make(chan struct{}), make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-quit:
			}
		}
		close(lines)
		exited <- cmd.Wait()
	}()
	stopReading := sync.OnceFunc(func() { close(quit) })
	stopped := false
	t.Cleanup(func() {
		stopReading()
		if !stopped { // a failed test still stops the cluster
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
		}
		<-exited
	})
	var gateways, admins []string
	printed := map[string]string{}          // "NATS", "CA", "creds" → the value printed
	deadline := time.After(4 * time.Minute) // make builds the binaries first
	for waiting := true; waiting; {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("make cluster ended before it was ready; gateways so far %v", gateways)
			}
			if u, ok := strings.CutPrefix(l, "gateway: "); ok {
				gateways = append(gateways, u)
			}
			if u, ok := strings.CutPrefix(l, "admin:"); ok && len(strings.Fields(u)) > 0 {
				admins = append(admins, strings.TrimSuffix(strings.Fields(u)[0], "/ui"))
			}
			if k, v, ok := strings.Cut(l, ":"); ok && len(strings.Fields(v)) > 0 {
				printed[k] = strings.Fields(v)[0]
			}
			waiting = !strings.HasPrefix(l, "Ctrl-C stops everything")
		case <-deadline:
			t.Fatal("make cluster printed no gateway within 4 minutes")
		}
	}
	stopReading()
	if len(gateways) != 2 || len(admins) != 2 {
		t.Fatalf("gateways %v, admin listeners %v, want 2 of each", gateways, admins)
	}

	for i, g := range gateways {
		h := clusterChat(t, g, "sk-acme-dev", "chat-large")
		if h.Get("X-Switchyard-Pool") != "premium" || h.Get("X-Switchyard-Replica") != "l70-prem-0" || h.Get("X-Switchyard-Model") != "llama-3-70b-instruct" {
			t.Errorf("%s: premium tenant routed to %v", g, h)
		}
		h = clusterChat(t, g, "", "auto")
		if h.Get("X-Switchyard-Model") != "llama-3-8b-instruct" || h.Get("X-Switchyard-Reason") == "" {
			t.Errorf("%s: anonymous cascade routed to %v", g, h)
		}
		// coder-gen-0 runs behind the GPU site's leaf node.
		h = clusterPost(t, g, "", `{"model":"auto","messages":[{"role":"user","content":"`+"```go\\nfunc main() {}\\n```"+`"}],"max_tokens":4}`)
		if h.Get("X-Switchyard-Replica") != "coder-gen-0" {
			t.Errorf("%s: code through the leaf node routed to %v", g, h)
		}
		// /metrics is on the admin listener only.
		if _, m := getWith(t, http.DefaultClient, admins[i]+"/metrics"); !strings.Contains(m, "switchyard_build_info{") {
			t.Errorf("%s/metrics has no switchyard_build_info", admins[i])
		}
		if _, m := getWith(t, http.DefaultClient, g+"/metrics"); strings.Contains(m, "switchyard_build_info") {
			t.Errorf("%s/metrics is public", g)
		}
	}

	// The bus is locked: no anonymous connection, and the operator's creds
	// printed read the table over TLS.
	if _, err := nats.Connect(printed["NATS"], nats.RootCAs(printed["CA"]), nats.RetryOnFailedConnect(false), nats.MaxReconnects(0)); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Errorf("an anonymous connection to %s: %v, want an authorization violation", printed["NATS"], err)
	}
	out, errOut, code := sy(t, nil, "", "table", "get", "policy", "--nats", printed["NATS"], "--tlsca", printed["CA"],
		"--creds", filepath.Join(printed["creds"], "operator.creds"))
	if code != 0 || !strings.Contains(out, "pool_rules") {
		t.Errorf("table get with the printed operator creds: exit %d: %s%s", code, out, errOut)
	}

	pids := readPids(t, filepath.Join(dir, "pids"))
	if len(pids) < 3+2+2+2 {
		t.Fatalf("only %d processes in the pids file", len(pids))
	}
	stopped = true
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited: // make reports the interrupt as a failure; what matters is what is left
		exited <- err // for the cleanup
	case <-time.After(90 * time.Second):
		t.Fatal("make cluster still running 90 s after Ctrl-C")
	}
	var left []string
	for pid, name := range pids {
		if syscall.Kill(pid, 0) == nil {
			left = append(left, fmt.Sprintf("%s (%d)", name, pid))
		}
	}
	if len(left) > 0 {
		t.Errorf("still running after Ctrl-C: %v", left)
	}
}

func clusterChat(t *testing.T, gateway, key, model string) http.Header {
	t.Helper()
	return clusterPost(t, gateway, key, `{"model":"`+model+`","messages":[{"role":"user","content":"Hello"}],"max_tokens":4}`)
}

func clusterPost(t *testing.T, gateway, key, body string) http.Header {
	t.Helper()
	status, h, b := chatOnce(t, gateway, body, bearer(key))
	if status != http.StatusOK {
		t.Fatalf("%s %s: %d %s", gateway, body, status, b)
	}
	return h
}

// readPids reads the launcher's "PID NAME" lines.
func readPids(t *testing.T, path string) map[int]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pids := map[int]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		if len(f) != 2 {
			t.Fatalf("pids line %q", l)
		}
		pid, err := strconv.Atoi(f[0])
		if err != nil {
			t.Fatal(err)
		}
		pids[pid] = f[1]
	}
	return pids
}
