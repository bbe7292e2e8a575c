package natstest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// clusterReadyTimeout bounds the election of a JetStream meta leader.
const clusterReadyTimeout = 30 * time.Second

// JSCluster is a JetStream cluster on loopback ports. Every member keeps its
// ports and store across Stop and Start, so restarts look like a process
// restart to the others.
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
func cluster(t testing.TB, n int, configure func(*server.Options)) *JSCluster {
	t.Helper()
	if n < 2 {
		t.Fatalf("a cluster needs at least 2 servers, got %d", n)
	}
	ports := freePorts(t, 2*n) // n client ports, then n route ports
	routes := make([]string, n)
	for i := range n {
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", ports[n+i])
	}
	c := &JSCluster{t: t, opts: make([]*server.Options, n), servers: make([]*server.Server, n)}
	for i := range n {
		c.opts[i] = &server.Options{
			ServerName: fmt.Sprintf("n%d", i+1),
			Host:       "127.0.0.1",
			Port:       ports[i],
			JetStream:  true,
			StoreDir:   t.TempDir(),
			Cluster: server.ClusterOpts{
				Name: "switchyard-test",
				Host: "127.0.0.1",
				Port: ports[n+i],
			},
			Routes: server.RoutesFromStr(strings.Join(routes, ",")),
		}
		if configure != nil {
			configure(c.opts[i])
		}
	}
	for i := range n {
		c.Start(i)
	}
	c.WaitLeader()
	return c
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

// Restart stops and starts member i.
func (c *JSCluster) Restart(i int) {
	c.t.Helper()
	c.Stop(i)
	c.Start(i)
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

// WaitLeader waits until the running members agree on a meta leader.
func (c *JSCluster) WaitLeader() {
	c.t.Helper()
	testkit.CheckFor(c.t, clusterReadyTimeout, 25*time.Millisecond, testkit.Cond("a JetStream meta leader", func() bool {
		if c.Leader() < 0 {
			return false
		}
		for _, s := range c.servers {
			if s != nil && !s.JetStreamIsCurrent() {
				return false
			}
		}
		return true
	}))
}
