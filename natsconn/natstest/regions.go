package natstest

import (
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// Regions is a NATS supercluster of two regions on loopback: one
// JetStream server per region, each its own cluster (named after the
// region), joined by NATS gateways that run through relays, so the link
// between the regions can be cut (both directions go silent, as a network
// link set down) and healed.
type Regions struct {
	servers [2]*server.Server
	relays  [2]*testkit.Relay // to servers[i]'s gateway port
}

// TwoRegions runs the supercluster of regions a and b (the names of its
// clusters and gateways) and waits until the gateways are up and
// JetStream has a meta leader. Servers ping their peers every 250 ms, so a
// cut is seen within a second.
func TwoRegions(t testing.TB, a, b string) *Regions {
	t.Helper()
	opts := func(name string) *server.Options {
		return &server.Options{
			ServerName: name, Host: "127.0.0.1", Port: server.RANDOM_PORT,
			JetStream: true, StoreDir: t.TempDir(),
			PingInterval: 250 * time.Millisecond, MaxPingsOut: 3,
			Cluster: server.ClusterOpts{Name: name, Host: "127.0.0.1", Port: server.RANDOM_PORT},
			Gateway: server.GatewayOpts{Name: name, Host: "127.0.0.1", Port: server.RANDOM_PORT},
			// A clustered JetStream will not start without a route: one to
			// an address that refuses (see cluster).
			Routes: []*url.URL{{Scheme: "nats", Host: testkit.Refusing(t)}},
		}
	}
	r := &Regions{}
	r.servers[0] = RunServer(t, opts(a))
	r.relays[0] = newGatewayRelay(t, r.servers[0])
	// b advertises its relay, so that a dials b through it too; the relay
	// is pointed at b once b runs and has its port.
	r.relays[1] = testkit.NewRelay(t, "127.0.0.1:0")
	ob := opts(b)
	ob.Gateway.Advertise = r.relays[1].Addr()
	ob.Gateway.Gateways = []*server.RemoteGatewayOpts{{Name: a, URLs: []*url.URL{{Scheme: "nats", Host: r.relays[0].Addr()}}}}
	r.servers[1] = RunServer(t, ob)
	r.relays[1].Retarget(r.servers[1].GatewayAddr().String())
	testkit.CheckFor(t, clusterReadyTimeout, 20*time.Millisecond, func() error {
		if !r.Linked() {
			return errors.New("the gateways are not up")
		}
		if !r.servers[0].JetStreamIsLeader() && !r.servers[1].JetStreamIsLeader() {
			return errors.New("no JetStream meta leader")
		}
		return nil
	})
	return r
}

// newGatewayRelay is a relay to s's gateway port.
func newGatewayRelay(t testing.TB, s *server.Server) *testkit.Relay {
	t.Helper()
	return testkit.NewRelay(t, s.GatewayAddr().String())
}

// Server is region i's server (0: a, 1: b).
func (r *Regions) Server(i int) *server.Server { return r.servers[i] }

// URL is region i's client URL.
func (r *Regions) URL(i int) string { return r.servers[i].ClientURL() }

// Linked reports whether each region has its gateway to the other up.
func (r *Regions) Linked() bool {
	return r.servers[0].NumOutboundGateways() > 0 && r.servers[1].NumOutboundGateways() > 0
}

// Unlinked reports whether neither region has a gateway to the other.
func (r *Regions) Unlinked() bool {
	return r.servers[0].NumOutboundGateways() == 0 && r.servers[1].NumOutboundGateways() == 0
}

// Cut silences the link between the regions, both ways.
func (r *Regions) Cut() {
	r.relays[0].Cut()
	r.relays[1].Cut()
}

// Heal carries the link again.
func (r *Regions) Heal() {
	r.relays[0].Heal()
	r.relays[1].Heal()
}
