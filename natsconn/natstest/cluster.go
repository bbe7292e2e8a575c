package natstest

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// clusterReadyTimeout bounds the election of a JetStream meta leader.
const clusterReadyTimeout = 30 * time.Second

// JSCluster is a JetStream cluster on loopback ports. Every member keeps the
// ports it bound and its store across Stop and Start, so restarts look like
// a process restart to the others.
type JSCluster struct {
	t       testing.TB
	opts    []*server.Options
	servers []*server.Server // nil while stopped
}

// Cluster runs an n-member JetStream cluster (n ≥ 2), shut down when the
// test ends, and waits until it has a meta leader.
func Cluster(t testing.TB, n int) *JSCluster {
	t.Helper()
	return cluster(t, n, nil)
}

// cluster is Cluster with each member's options passed through configure.
//
// Every port is the server's own choice (RANDOM_PORT), so none is guessed:
// the members start one after another, each routed to the cluster
// addresses the earlier ones bound, and gossip completes the mesh. A
// clustered JetStream will not start without a configured route, which the
// first member cannot have yet: it is given one to an address that refuses,
// and reloads with routes to the others once they are up. Each member then
// keeps the ports it bound, and routes to every other, for its restarts.
func cluster(t testing.TB, n int, configure func(*server.Options)) *JSCluster {
	t.Helper()
	if n < 2 {
		t.Fatalf("a cluster needs at least 2 servers, got %d", n)
	}
	c := &JSCluster{t: t, opts: make([]*server.Options, n), servers: make([]*server.Server, n)}
	for i := range n {
		c.opts[i] = &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1",
			Port:       server.RANDOM_PORT,
			JetStream:  true,
			StoreDir:   t.TempDir(),
			Cluster: server.ClusterOpts{
				Name: "switchyard-test",
				Host: "127.0.0.1",
				Port: server.RANDOM_PORT,
			},
		}
		if configure != nil {
			configure(c.opts[i])
		}
	}
	// The first member's route refuses: a port held, for the test, by a
	// socket that does not listen.
	seed := &url.URL{Scheme: "nats", Host: testkit.Refusing(t)}
	for i := range n {
		opts := *c.opts[i]
		opts.Routes = c.routes(func(j int) bool { return j < i })
		if i == 0 {
			opts.Routes = []*url.URL{seed}
		}
		s := RunServer(t, &opts)
		c.servers[i] = s
		c.opts[i].Port = s.Addr().(*net.TCPAddr).Port
		c.opts[i].Cluster.Port = s.ClusterAddr().Port
	}
	for i := range n {
		c.opts[i].Routes = c.routes(func(j int) bool { return j != i })
	}
	first := *c.opts[0]
	if err := c.servers[0].ReloadOptions(&first); err != nil {
		t.Fatalf("reloading the first member's routes: %v", err)
	}
	c.WaitLeader()
	return c
}

// routes are the cluster URLs of the members for which pick is true; a
// member's cluster port is known once it has started.
func (c *JSCluster) routes(pick func(int) bool) []*url.URL {
	var urls []*url.URL
	for j, o := range c.opts {
		if pick(j) {
			urls = append(urls, &url.URL{Scheme: "nats", Host: net.JoinHostPort(o.Cluster.Host, strconv.Itoa(o.Cluster.Port))})
		}
	}
	return urls
}

// Servers returns the running members (nil for a stopped one).
func (c *JSCluster) Servers() []*server.Server { return append([]*server.Server(nil), c.servers...) }

// URL lists every member's client URL, comma-separated, for nats.Connect.
func (c *JSCluster) URL() string {
	urls := make([]string, len(c.opts))
	for i, o := range c.opts {
		urls[i] = fmt.Sprintf("nats://127.0.0.1:%d", o.Port)
	}
	return strings.Join(urls, ",")
}

// Stop shuts member i down and waits until it is gone.
func (c *JSCluster) Stop(i int) {
	if s := c.servers[i]; s != nil {
		shutdown(s)
		c.servers[i] = nil
	}
}

// Start starts member i again (a no-op while it runs).
func (c *JSCluster) Start(i int) {
	c.t.Helper()
	if c.servers[i] != nil {
		return
	}
	opts := *c.opts[i]
	c.servers[i] = RunServer(c.t, &opts)
}

// Leader returns the index of the JetStream meta leader, or -1.
func (c *JSCluster) Leader() int {
	for i, s := range c.servers {
		if s != nil && s.JetStreamIsLeader() {
			return i
		}
	}
	return -1
}

// WaitLeader waits until the running members agree on a meta leader that
// counts every one of them as a JetStream peer it can place streams on.
func (c *JSCluster) WaitLeader() {
	c.t.Helper()
	testkit.CheckFor(c.t, clusterReadyTimeout, 25*time.Millisecond, testkit.Cond("a JetStream meta leader with every running member as a peer", func() bool {
		leader := c.Leader()
		if leader < 0 {
			return false
		}
		running := 0
		for _, s := range c.servers {
			if s == nil {
				continue
			}
			if !s.JetStreamIsCurrent() {
				return false
			}
			running++
		}
		return len(c.servers[leader].JetStreamClusterPeers()) == running
	}))
}
