package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/switchyard-llm/switchyard/devstack"
)

// natsCluster is the running NATS cluster as the parts connect to it.
type natsCluster struct {
	url   string // every client URL, comma-separated
	ca    string // the CA that signed the servers' certificates
	site  string // the GPU site's leaf server, for the adapters there
	creds string // the directory of every identity's creds file
}

// credsFor is the creds file of an identity (gateway, broker, operator,
// observer, adapter-<replica>).
func (n natsCluster) credsFor(identity string) string {
	return filepath.Join(n.creds, identity+".creds")
}

// authorize generates the authorization with `switchyard auth init`: creds
// for every role and every dev replica, and the server fragment each NATS
// server includes as switchyard/server.conf.
func authorize(ctx context.Context, cfg config) (authDir string, err error) {
	authDir = filepath.Join(cfg.dir, "auth")
	ids := make([]string, 0, len(devstack.Replicas()))
	for _, r := range devstack.Replicas() {
		ids = append(ids, r.ID)
	}
	cmd := exec.CommandContext(ctx, cfg.switchyard, "auth", "init", authDir, "--replicas", strings.Join(ids, ","))
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("switchyard auth init: %v: %s", err, out)
	}
	return authDir, nil
}

// startNATS makes throwaway certificates with deploy/nats/make-certs.sh,
// gives each server a directory with the shipped cluster.conf and a
// node.conf of loopback addresses, starts the three and waits until each
// reports healthy JetStream.
func startNATS(ctx context.Context, cfg config, procs *procs) (natsCluster, error) {
	const n = 3
	authDir, err := authorize(ctx, cfg)
	if err != nil {
		return natsCluster{}, err
	}
	serverAuth, err := os.ReadFile(filepath.Join(authDir, "server.conf"))
	if err != nil {
		return natsCluster{}, err
	}
	account, err := switchyardAccount(filepath.Join(authDir, "creds", "gateway.creds"))
	if err != nil {
		return natsCluster{}, err
	}
	leafJS := fmt.Appendf(nil, "default_js_domain: { %s: \"\" }\n", account)
	tlsDir := filepath.Join(cfg.dir, "tls")
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("nats-%d", i+1)
	}
	mk := exec.CommandContext(ctx, filepath.Join(cfg.root, "deploy", "nats", "make-certs.sh"), append([]string{tlsDir}, names...)...)
	mk.Env = append(os.Environ(), "EXTRA_SANS=DNS:localhost,IP:127.0.0.1", "DAYS=7")
	if out, err := mk.CombinedOutput(); err != nil {
		return natsCluster{}, fmt.Errorf("make-certs.sh: %v: %s", err, out)
	}
	ports, err := freePorts(4 * n) // client, route, monitor, leaf
	if err != nil {
		return natsCluster{}, err
	}
	routes := make([]string, n)
	clients := make([]string, n)
	for i := range n {
		routes[i] = fmt.Sprintf("%q", fmt.Sprintf("nats-route://127.0.0.1:%d", ports[n+i]))
		clients[i] = fmt.Sprintf("tls://127.0.0.1:%d", ports[i])
	}
	shipped, err := os.ReadFile(filepath.Join(cfg.root, "deploy", "nats", "cluster.conf"))
	if err != nil {
		return natsCluster{}, err
	}
	monitors := make([]string, n)
	for i, name := range names {
		dir := filepath.Join(cfg.dir, name)
		monitors[i] = fmt.Sprintf("127.0.0.1:%d", ports[2*n+i])
		node := fmt.Sprintf(`NODE_NAME: %s
CLIENT_LISTEN: "127.0.0.1:%d"
MONITOR_LISTEN: %q
ROUTE_LISTEN: "127.0.0.1:%d"
LEAF_LISTEN: "127.0.0.1:%d"
ROUTES: [%s]
JETSTREAM_DIR: %q
TLS_CERT: %q
TLS_KEY: %q
TLS_CA: %q
`, name, ports[i], monitors[i], ports[n+i], ports[3*n+i], strings.Join(routes, ", "), filepath.Join(dir, "jetstream"),
			filepath.Join(tlsDir, name+".pem"), filepath.Join(tlsDir, name+"-key.pem"), filepath.Join(tlsDir, "ca.pem"))
		if err := os.MkdirAll(filepath.Join(dir, "switchyard"), 0o755); err != nil {
			return natsCluster{}, err
		}
		if err := os.WriteFile(filepath.Join(dir, "switchyard", "server.conf"), serverAuth, 0o644); err != nil {
			return natsCluster{}, err
		}
		if err := os.WriteFile(filepath.Join(dir, "switchyard", "leafnodes.conf"), leafJS, 0o644); err != nil {
			return natsCluster{}, err
		}
		if err := os.WriteFile(filepath.Join(dir, "node.conf"), []byte(node), 0o644); err != nil {
			return natsCluster{}, err
		}
		if err := os.WriteFile(filepath.Join(dir, "cluster.conf"), shipped, 0o644); err != nil {
			return natsCluster{}, err
		}
		if err := procs.start(name, dir, nil, cfg.natsServer, "-c", "cluster.conf"); err != nil {
			return natsCluster{}, err
		}
	}
	for i, m := range monitors {
		if err := poll(ctx, 60*time.Second, procs, names[i]+" healthy", func() bool { return httpOK("http://" + m + "/healthz") }); err != nil {
			return natsCluster{}, err
		}
	}
	leafURLs := make([]string, n)
	for i := range n {
		leafURLs[i] = fmt.Sprintf("%q", fmt.Sprintf("tls://127.0.0.1:%d", ports[3*n+i]))
	}
	nc := natsCluster{url: strings.Join(clients, ","), ca: filepath.Join(tlsDir, "ca.pem"), creds: filepath.Join(authDir, "creds")}
	nc.site, err = startSite(ctx, cfg, procs, strings.Join(leafURLs, ", "), nc.ca, nc.credsFor("adapter-"+siteReplica))
	return nc, err
}

// startSite runs deploy/nats/leaf-gpu-site.conf as a GPU site that dials
// the cluster's leaf ports, and waits until its leaf connection is up.
func startSite(ctx context.Context, cfg config, procs *procs, leafURLs, ca, creds string) (string, error) {
	ports, err := freePorts(2)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cfg.dir, "gpu-site-1")
	monitor := fmt.Sprintf("127.0.0.1:%d", ports[1])
	site := fmt.Sprintf(`SITE_NAME: gpu-site-1
SITE_LISTEN: "127.0.0.1:%d"
SITE_MONITOR_LISTEN: %q
CORE_LEAF_URLS: [%s]
TLS_CA: %q
SITE_CREDS: %q
`, ports[0], monitor, leafURLs, ca, creds)
	shipped, err := os.ReadFile(filepath.Join(cfg.root, "deploy", "nats", "leaf-gpu-site.conf"))
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "site.conf"), []byte(site), 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "leaf-gpu-site.conf"), shipped, 0o644); err != nil {
		return "", err
	}
	if err := procs.start("gpu-site-1", dir, nil, cfg.natsServer, "-c", "leaf-gpu-site.conf"); err != nil {
		return "", err
	}
	err = poll(ctx, 30*time.Second, procs, "gpu-site-1's leaf connection", func() bool {
		var leafz struct {
			Leafs int `json:"leafnodes"`
		}
		return getJSON("http://"+monitor+"/leafz", &leafz) && leafz.Leafs > 0
	})
	return fmt.Sprintf("nats://127.0.0.1:%d", ports[0]), err
}

func getJSON(url string, v any) bool {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(v) == nil
}

// switchyardAccount is the public key of the account a creds file's user
// belongs to.
func switchyardAccount(creds string) (string, error) {
	b, err := os.ReadFile(creds)
	if err != nil {
		return "", err
	}
	token, err := jwt.ParseDecoratedJWT(b)
	if err != nil {
		return "", fmt.Errorf("%s: %w", creds, err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return "", fmt.Errorf("%s: %w", creds, err)
	}
	if uc.IssuerAccount != "" { // signed with the account's signing key
		return uc.IssuerAccount, nil
	}
	return uc.Issuer, nil
}

// freePorts returns n loopback ports free at the time of the call.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	lns := make([]net.Listener, 0, n)
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func httpOK(url string) bool {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// poll waits until ok, failing after timeout, on ctx, or when a process exits.
func poll(ctx context.Context, timeout time.Duration, procs *procs, what string, ok func() bool) error {
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for !ok() {
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting for %s: gave up after %s", what, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-procs.exited:
			return err
		case <-t.C:
		}
	}
	return nil
}
