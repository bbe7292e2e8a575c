package test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/auth"
	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/internal/sse"
	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// selfSigned writes a certificate for 127.0.0.1 and its key, and returns
// their paths and a pool that trusts the certificate.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	cert, key, pool := testkit.SelfSigned(t)
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, cert, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, pool
}

// runGateway runs `switchyard gateway` with args until the test ends and
// returns the addresses its log says it listens on.
func runGateway(t *testing.T, env []string, args ...string) (public, admin string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, binary(t), append([]string{"gateway", "--log-level", "info"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		wg.Wait()
	})
	addrs := make(chan [2]string, 2)
	re := regexp.MustCompile(`msg="(gateway|admin) listening" .*\baddr=(\S+)`)
	wg.Go(func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addrs <- [2]string{m[1], m[2]}
			} else if strings.Contains(sc.Text(), "level=ERROR") {
				t.Log(sc.Text())
			}
		}
	})
	timeout := time.After(20 * time.Second)
	for public == "" || admin == "" {
		select {
		case a := <-addrs:
			if a[0] == "gateway" {
				public = a[1]
			} else {
				admin = a[1]
			}
		case <-timeout:
			t.Fatalf("the gateway did not say where it listens (public %q, admin %q)", public, admin)
		}
	}
	return public, admin
}

func getWith(t *testing.T, c *http.Client, url string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestProductionGatewayListeners runs `switchyard gateway` with a
// certificate the test makes: the public listener speaks HTTPS and HTTP/2,
// serves the API, /healthz and /readyz and answers 404 for the dashboard
// and /metrics, which the admin listener serves, without any API key.
func TestProductionGatewayListeners(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed("l8-gen-0")})
	certFile, keyFile, pool := selfSigned(t)
	env := []string{"NATS_URL=" + st.NATSURL(), "NATS_CREDS=" + st.Creds(auth.Role{Kind: auth.RoleGateway}), "HOME=" + t.TempDir()}
	public, admin := runGateway(t, env, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
		"--tls-cert", certFile, "--tls-key", keyFile)

	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	https := &http.Client{Transport: tr, Timeout: 20 * time.Second}
	base := "https://" + public
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if resp, body := getWith(t, https, base+"/readyz"); resp.StatusCode != 200 {
			return fmt.Errorf("/readyz: %d %s", resp.StatusCode, body)
		}
		return nil
	})
	resp, _ := getWith(t, https, base+"/healthz")
	if resp.StatusCode != 200 || resp.ProtoMajor != 2 {
		t.Errorf("/healthz over HTTPS: %d %s, want 200 over HTTP/2", resp.StatusCode, resp.Proto)
	}
	for _, p := range []string{"/ui", "/ui/", "/ui/state", "/metrics"} {
		if resp, _ := getWith(t, https, base+p); resp.StatusCode != 404 {
			t.Errorf("public %s: %d, want 404", p, resp.StatusCode)
		}
	}

	// A stream over HTTPS arrives chunk by chunk, to its end.
	req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(
		`{"model":"chat-small","stream":true,"max_tokens":8,"messages":[{"role":"user","content":"Hello"}]}`))
	req.Header.Set("Content-Type", "application/json")
	sresp, err := https.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer sresp.Body.Close()
	if sresp.StatusCode != 200 || sresp.ProtoMajor != 2 || !sse.IsEventStream(sresp.Header.Get("Content-Type")) {
		t.Fatalf("stream over HTTPS: %d %s %s", sresp.StatusCode, sresp.Proto, sresp.Header.Get("Content-Type"))
	}
	chunks, done := 0, false
	for r := sse.NewReader(sresp.Body, 1<<20); ; {
		l, err := r.Next()
		if err != nil {
			break
		}
		switch {
		case l.Done():
			done = true
		case l.Field == "data":
			chunks++
		}
	}
	if chunks < 2 || !done {
		t.Errorf("stream over HTTPS: %d chunks, [DONE] %v", chunks, done)
	}

	plain := &http.Client{Timeout: 10 * time.Second}
	abase := "http://" + admin
	if resp, body := getWith(t, plain, abase+"/ui/"); resp.StatusCode != 200 || !strings.Contains(body, "<title>Switchyard</title>") {
		t.Errorf("admin /ui/: %d", resp.StatusCode)
	}
	if resp, body := getWith(t, plain, abase+"/metrics"); resp.StatusCode != 200 || !strings.Contains(body, "switchyard_gateway_open_connections") {
		t.Errorf("admin /metrics: %d", resp.StatusCode)
	}
	resp, state := getWith(t, plain, abase+"/ui/state")
	if resp.StatusCode != 200 || !strings.Contains(state, `"api_keys":5`) {
		t.Errorf("admin /ui/state: %d, want the table with 5 API keys counted:\n%.400s", resp.StatusCode, state)
	}
	for _, key := range []string{"sk-acme-dev", "sk-teamx-dev", "sk-intern-dev", "sk-trial-dev", "sk-default-dev"} {
		sum := sha256.Sum256([]byte(key))
		if h := hex.EncodeToString(sum[:]); strings.Contains(state, h[:16]) {
			t.Errorf("/ui/state holds the hash of %s", key)
		}
	}
	if strings.Contains(state, `"keys.`) {
		t.Error("/ui/state holds a keys.* entry")
	}
	if resp, _ := getWith(t, plain, abase+"/v1/models"); resp.StatusCode == 200 {
		t.Error("the admin listener serves the API")
	}
}
