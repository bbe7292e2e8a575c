package natstest

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/auth"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn"
)

// Secured is a server (or a cluster) running Switchyard's authorization,
// with a creds file for every identity.
type Secured struct {
	Server   *server.Server // nil for a cluster
	URL      string
	Store    *auth.Store
	CredsDir string
}

// StartSecured runs a JetStream server under the authorization `switchyard
// auth init` makes for cfg (nobody connects anonymously), shut down when the
// test ends.
func StartSecured(t testing.TB, cfg auth.Config) *Secured {
	t.Helper()
	sec, trust := secure(t, cfg)
	opts := &server.Options{Port: server.RANDOM_PORT, JetStream: true, StoreDir: t.TempDir()}
	if err := trust.Apply(opts); err != nil {
		t.Fatal(err)
	}
	sec.Server = RunServer(t, opts)
	sec.URL = sec.Server.ClientURL()
	return sec
}

// ClusterSecured is Cluster with every member under the authorization
// `switchyard auth init` makes for cfg.
func ClusterSecured(t testing.TB, n int, cfg auth.Config) (*JSCluster, *Secured) {
	t.Helper()
	sec, trust := secure(t, cfg)
	c := cluster(t, n, func(o *server.Options) {
		// Each member gets a resolver of its own.
		if err := trust.Apply(o); err != nil {
			t.Fatal(err)
		}
	})
	sec.URL = c.URL()
	// The meta leader takes up an account's JetStream when it first hears
	// of the account, which may be after it was elected: until then a
	// stream or bucket created in it fails "JetStream not enabled for
	// account". Ask the leader, as the operator, until it answers.
	nc := sec.Connect(t, auth.Role{Kind: auth.RoleOperator})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, clusterReadyTimeout, 25*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := js.AccountInfo(ctx)
		return err
	})
	nc.Close()
	return c, sec
}

func secure(t testing.TB, cfg auth.Config) (*Secured, *natsconn.Trust) {
	t.Helper()
	dir := t.TempDir()
	store, err := auth.Init(filepath.Join(dir, "auth"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	creds := filepath.Join(dir, "creds")
	if err := store.WriteAllCreds(creds, cfg.Replicas); err != nil {
		t.Fatal(err)
	}
	trust, err := store.Trust()
	if err != nil {
		t.Fatal(err)
	}
	return &Secured{Store: store, CredsDir: creds}, trust
}

// Creds is the path of role's creds file (an adapter's or tenant's is made
// on first use).
func (s *Secured) Creds(t testing.TB, role auth.Role) string {
	t.Helper()
	path, err := s.Store.WriteCreds(s.CredsDir, role)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// Connect connects as role, closed when the test ends.
func (s *Secured) Connect(t testing.TB, role auth.Role, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.URL, append([]nats.Option{nats.UserCredentials(s.Creds(t, role)), nats.Name(role.Name())}, opts...)...)
	if err != nil {
		t.Fatalf("connecting as %s: %v", role.Name(), err)
	}
	t.Cleanup(nc.Close)
	return nc
}
