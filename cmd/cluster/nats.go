package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/jwt/v2"

	"github.com/switchyard-llm/switchyard/devstack"
)

// natsCluster is the running NATS cluster as the parts connect to it.
type natsCluster struct {
	url      string   // every client URL, comma-separated
	monitors []string // each server's monitoring URL
	ca       string   // the CA that signed the servers' certificates
	site     string   // the GPU site's leaf server, for the adapters there
	creds    string   // the directory of every identity's creds file
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

// natsNode is one NATS server of the cluster and the ports it bound.
type natsNode struct {
	name, dir                    string
	host                         string // the address it listens on
	client, route, monitor, leaf int
}

// conf is the node.conf that includes the shipped cluster.conf: the
// node's addresses, routes and certificate. Ports are the server's choice
// ("127.0.0.1:-1") until it has bound them; from then on it keeps them.
func (nd natsNode) conf(tlsDir string, routes []string) []byte {
	addr := func(port int) string {
		if port == 0 {
			return nd.host + ":-1"
		}
		return fmt.Sprintf("%s:%d", nd.host, port)
	}
	quoted := make([]string, len(routes))
	for i, r := range routes {
		quoted[i] = strconv.Quote(r)
	}
	return fmt.Appendf(nil, `NODE_NAME: %s
CLIENT_LISTEN: %q
MONITOR_LISTEN: %q
ROUTE_LISTEN: %q
LEAF_LISTEN: %q
ROUTES: [%s]
JETSTREAM_DIR: %q
TLS_CERT: %q
TLS_KEY: %q
TLS_CA: %q
`, nd.name, addr(nd.client), addr(nd.monitor), addr(nd.route), addr(nd.leaf), strings.Join(quoted, ", "),
		filepath.Join(nd.dir, "jetstream"), filepath.Join(tlsDir, nd.name+".pem"), filepath.Join(tlsDir, nd.name+"-key.pem"), filepath.Join(tlsDir, "ca.pem"))
}

func (nd natsNode) routeURL() string { return fmt.Sprintf("nats-route://%s:%d", nd.host, nd.route) }

// In namespaces each server has an address of its own, and listens on the
// usual ports there.
const (
	nsClientPort  = 4222
	nsRoutePort   = 6222
	nsMonitorPort = 8222
	nsLeafPort    = 7422
)

// startNATS makes throwaway certificates with deploy/nats/make-certs.sh,
// gives each server a directory with the shipped cluster.conf and a
// node.conf of loopback addresses, starts the three one after another and
// waits until each reports healthy JetStream.
//
// No port is chosen here: each server binds ports of its own choosing and
// reports them (--ports_file_dir, then /varz), and each later server routes
// to the earlier ones; gossip completes the mesh. A clustered JetStream
// will not start without a configured route, which the first server cannot
// have yet: it is given one to an address that refuses (a port this
// launcher holds without listening), and reloads with routes to the others
// once they are up. Each node.conf is then rewritten with the ports its
// server bound and routes to every other server, for its restarts.
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
	nodes := make([]natsNode, n)
	names := make([]string, n)
	for i := range nodes {
		names[i] = fmt.Sprintf("nats-%d", i+1)
		nodes[i] = natsNode{name: names[i], dir: filepath.Join(cfg.dir, names[i]), host: cfg.net.addr(names[i])}
		if cfg.net != nil {
			nodes[i].client, nodes[i].route, nodes[i].monitor, nodes[i].leaf = nsClientPort, nsRoutePort, nsMonitorPort, nsLeafPort
		}
	}
	// Each certificate names its server's address (make-certs.sh keeps
	// the CA it made first).
	for _, nd := range nodes {
		mk := exec.CommandContext(ctx, filepath.Join(cfg.root, "deploy", "nats", "make-certs.sh"), tlsDir, nd.name)
		mk.Env = append(os.Environ(), "EXTRA_SANS=DNS:localhost,IP:127.0.0.1"+map[bool]string{true: ",IP:" + nd.host}[nd.host != "127.0.0.1"], "DAYS=7")
		if out, err := mk.CombinedOutput(); err != nil {
			return natsCluster{}, fmt.Errorf("make-certs.sh: %v: %s", err, out)
		}
	}
	shipped, err := os.ReadFile(filepath.Join(cfg.root, "deploy", "nats", "cluster.conf"))
	if err != nil {
		return natsCluster{}, err
	}
	files := func(nd natsNode, routes []string) map[string][]byte {
		return map[string][]byte{
			filepath.Join("switchyard", "server.conf"):    serverAuth,
			filepath.Join("switchyard", "leafnodes.conf"): leafJS,
			"node.conf":    nd.conf(tlsDir, routes),
			"cluster.conf": shipped,
		}
	}
	if cfg.net != nil {
		// Every address is known: each server routes to the others from
		// the start.
		for i, nd := range nodes {
			if err := writeFiles(nd.dir, files(nd, routesExcept(nodes, i))); err != nil {
				return natsCluster{}, err
			}
			exe, args := cfg.net.command(nd.name, cfg.natsServer, []string{"-c", "cluster.conf"})
			if err := procs.start(nd.name, nd.dir, nil, nil, exe, args...); err != nil {
				return natsCluster{}, err
			}
		}
		return clusterUp(ctx, cfg, procs, nodes, authDir, tlsDir)
	}
	seed, err := refusing()
	if err != nil {
		return natsCluster{}, err
	}
	defer seed.close()
	for i := range nodes {
		nd := &nodes[i]
		routes := routesExcept(nodes[:i], -1) // the earlier servers
		if i == 0 {
			routes = []string{"nats-route://" + seed.addr}
		}
		if err := writeFiles(nd.dir, files(*nd, routes)); err != nil {
			return natsCluster{}, err
		}
		if err := procs.start(nd.name, nd.dir, nil, nil, cfg.natsServer, "-c", "cluster.conf", "--ports_file_dir", nd.dir); err != nil {
			return natsCluster{}, err
		}
		if err := learnPorts(ctx, cfg, procs, nd); err != nil {
			return natsCluster{}, err
		}
	}
	// The first server reloads its routes. nats-server cannot reload the
	// monitoring port it picked, so it reads that one as it was until the
	// reload is done.
	first := nodes[0]
	first.monitor = 0
	if err := os.WriteFile(filepath.Join(first.dir, "node.conf"), first.conf(tlsDir, routesExcept(nodes, 0)), 0o644); err != nil {
		return natsCluster{}, err
	}
	if err := procs.signal(first.name, syscall.SIGHUP); err != nil {
		return natsCluster{}, err
	}
	varzURL := fmt.Sprintf("http://127.0.0.1:%d/varz", nodes[0].monitor)
	if err := poll(ctx, 30*time.Second, procs, first.name+"'s routes reloaded", func() bool {
		var varz natsVarz
		return getJSON(varzURL, &varz) && len(varz.Cluster.URLs) == n-1 && !slices.Contains(varz.Cluster.URLs, seed.addr)
	}); err != nil {
		return natsCluster{}, err
	}
	for i, nd := range nodes {
		if err := os.WriteFile(filepath.Join(nd.dir, "node.conf"), nd.conf(tlsDir, routesExcept(nodes, i)), 0o644); err != nil {
			return natsCluster{}, err
		}
	}
	return clusterUp(ctx, cfg, procs, nodes, authDir, tlsDir)
}

// clusterUp waits until every server reports healthy JetStream, then
// starts the GPU site.
func clusterUp(ctx context.Context, cfg config, procs *procs, nodes []natsNode, authDir, tlsDir string) (natsCluster, error) {
	nc := natsCluster{ca: filepath.Join(tlsDir, "ca.pem"), creds: filepath.Join(authDir, "creds")}
	var clients, leafURLs []string
	for _, nd := range nodes {
		m := fmt.Sprintf("http://%s:%d", nd.host, nd.monitor)
		if err := poll(ctx, 60*time.Second, procs, nd.name+" healthy", func() bool { return httpOK(m + "/healthz") }); err != nil {
			return natsCluster{}, err
		}
		nc.monitors = append(nc.monitors, m)
		clients = append(clients, fmt.Sprintf("tls://%s:%d", nd.host, nd.client))
		leafURLs = append(leafURLs, strconv.Quote(fmt.Sprintf("tls://%s:%d", nd.host, nd.leaf)))
	}
	nc.url = strings.Join(clients, ",")
	var err error
	nc.site, err = startSite(ctx, cfg, procs, strings.Join(leafURLs, ", "), nc.ca, nc.credsFor("adapter-"+siteReplica))
	return nc, err
}

// routesExcept is the route URLs of every node but nodes[i] (of every
// node for i = -1).
func routesExcept(nodes []natsNode, i int) []string {
	var routes []string
	for j, nd := range nodes {
		if j != i {
			routes = append(routes, nd.routeURL())
		}
	}
	return routes
}

// natsVarz is what the launcher reads of a server's /varz.
type natsVarz struct {
	Port    int `json:"port"`
	Cluster struct {
		Port int      `json:"cluster_port"`
		URLs []string `json:"urls"`
	} `json:"cluster"`
	Leaf struct {
		Port int `json:"port"`
	} `json:"leaf"`
}

// learnPorts waits for the ports file the server nd writes once it is ready
// (--ports_file_dir): it names the monitoring address, and /varz there the
// client, route and leaf ports.
func learnPorts(ctx context.Context, cfg config, procs *procs, nd *natsNode) error {
	ports, err := portsOf(ctx, cfg, procs, nd.name, nd.dir)
	if err != nil {
		return err
	}
	monitor := ports.Monitoring[0]
	var varz natsVarz
	if err := poll(ctx, 30*time.Second, procs, nd.name+"'s /varz", func() bool {
		return getJSON(monitor+"/varz", &varz) && varz.Port > 0 && varz.Cluster.Port > 0 && varz.Leaf.Port > 0
	}); err != nil {
		return err
	}
	u, err := url.Parse(monitor)
	if err != nil {
		return err
	}
	if nd.monitor, err = strconv.Atoi(u.Port()); err != nil {
		return fmt.Errorf("%s's monitoring address %q: %w", nd.name, monitor, err)
	}
	nd.client, nd.route, nd.leaf = varz.Port, varz.Cluster.Port, varz.Leaf.Port
	return nil
}

// natsPorts is nats-server's ports file.
type natsPorts struct {
	Nats       []string `json:"nats"`
	Monitoring []string `json:"monitoring"`
}

// portsOf waits for the ports file of the server name, started with
// --ports_file_dir dir.
func portsOf(ctx context.Context, cfg config, procs *procs, name, dir string) (natsPorts, error) {
	file := filepath.Join(dir, fmt.Sprintf("%s_%d.ports", filepath.Base(cfg.natsServer), procs.pid(name)))
	var ports natsPorts
	err := poll(ctx, 30*time.Second, procs, name+"'s ports file", func() bool {
		b, err := os.ReadFile(file)
		return err == nil && json.Unmarshal(b, &ports) == nil && len(ports.Nats) > 0 && len(ports.Monitoring) > 0
	})
	return ports, err
}

// writeFiles writes files (paths relative to dir), making the directories.
func writeFiles(dir string, files map[string][]byte) error {
	for name, b := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// refusingAddr is a loopback address that refuses connections: its port is
// bound, until close, by a socket that does not listen.
type refusingAddr struct {
	addr string
	fd   int
}

func refusing() (refusingAddr, error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return refusingAddr{}, err
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		syscall.Close(fd)
		return refusingAddr{}, err
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		syscall.Close(fd)
		return refusingAddr{}, err
	}
	return refusingAddr{addr: fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port), fd: fd}, nil
}

func (r refusingAddr) close() { _ = syscall.Close(r.fd) }

// startSite runs deploy/nats/leaf-gpu-site.conf as a GPU site that dials
// the cluster's leaf ports, and waits until its leaf connection is up. Its
// ports are its own choice, kept (site.conf rewritten) for its restarts.
//
// In namespaces it listens on the site namespace's loopback (its adapter
// runs there) on the usual port, and its monitoring on the site's address.
func startSite(ctx context.Context, cfg config, procs *procs, leafURLs, ca, creds string) (string, error) {
	const name = siteName
	dir := filepath.Join(cfg.dir, name)
	site := func(listen, monitor string) []byte {
		return fmt.Appendf(nil, `SITE_NAME: %s
SITE_LISTEN: %q
SITE_MONITOR_LISTEN: %q
CORE_LEAF_URLS: [%s]
TLS_CA: %q
SITE_CREDS: %q
`, name, listen, monitor, leafURLs, ca, creds)
	}
	shipped, err := os.ReadFile(filepath.Join(cfg.root, "deploy", "nats", "leaf-gpu-site.conf"))
	if err != nil {
		return "", err
	}
	listen, monitorListen := "127.0.0.1:-1", "127.0.0.1:-1"
	if cfg.net != nil {
		listen, monitorListen = fmt.Sprintf("127.0.0.1:%d", nsClientPort), fmt.Sprintf("%s:%d", cfg.net.addr(name), nsMonitorPort)
	}
	if err := writeFiles(dir, map[string][]byte{"site.conf": site(listen, monitorListen), "leaf-gpu-site.conf": shipped}); err != nil {
		return "", err
	}
	exe, args := cfg.net.command(name, cfg.natsServer, []string{"-c", "leaf-gpu-site.conf", "--ports_file_dir", dir})
	if err := procs.start(name, dir, nil, nil, exe, args...); err != nil {
		return "", err
	}
	ports, err := portsOf(ctx, cfg, procs, name, dir)
	if err != nil {
		return "", err
	}
	client, err := url.Parse(ports.Nats[0])
	if err != nil {
		return "", err
	}
	monitor, err := url.Parse(ports.Monitoring[0])
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "site.conf"), site(client.Host, monitor.Host), 0o644); err != nil {
		return "", err
	}
	err = poll(ctx, 30*time.Second, procs, name+"'s leaf connection", func() bool {
		var leafz struct {
			Leafs int `json:"leafnodes"`
		}
		return getJSON(ports.Monitoring[0]+"/leafz", &leafz) && leafz.Leafs > 0
	})
	return ports.Nats[0], err
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
