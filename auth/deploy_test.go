package auth_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/auth"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
)

// TestDeployConfig runs deploy/nats/nats-server.conf as shipped, with a
// generated authorization and a throwaway certificate: TLS clients with
// creds connect, anonymous ones do not.
func TestDeployConfig(t *testing.T) {
	dir := t.TempDir()
	shipped, err := os.ReadFile(filepath.Join("..", "deploy", "nats", "nats-server.conf"))
	if err != nil {
		t.Fatal(err)
	}
	// This machine's directory stands for /etc/nats.
	shipped = bytes.ReplaceAll(shipped, []byte("/etc/nats/"), []byte(dir+"/"))
	conf := filepath.Join(dir, "nats-server.conf")
	if err := os.WriteFile(conf, shipped, 0o600); err != nil {
		t.Fatal(err)
	}
	store, err := auth.Init(filepath.Join(dir, "switchyard"), auth.Config{Tenants: []string{"acme"}})
	if err != nil {
		t.Fatal(err)
	}
	creds := filepath.Join(dir, "switchyard", "creds")
	if err := store.WriteAllCreds(creds, nil); err != nil {
		t.Fatal(err)
	}
	ca := writeCert(t, filepath.Join(dir, "tls"))
	t.Setenv("SERVER_NAME", "n1")

	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("deploy/nats/nats-server.conf: %v", err)
	}
	if opts.TLSConfig == nil || len(opts.TrustedOperators) != 1 || opts.SystemAccount == "" || !opts.JetStream {
		t.Fatalf("TLS %v, operators %d, system account %q, JetStream %v", opts.TLSConfig != nil, len(opts.TrustedOperators), opts.SystemAccount, opts.JetStream)
	}
	// This machine's ports and store, not the production ones.
	opts.Host, opts.Port, opts.HTTPPort, opts.StoreDir = "127.0.0.1", server.RANDOM_PORT, 0, t.TempDir()
	s := natstest.RunServer(t, opts)
	url := "tls://" + s.Addr().String()

	nc, err := nats.Connect(url, nats.RootCAs(ca), nats.UserCredentials(filepath.Join(creds, "observer.creds")))
	if err != nil {
		t.Fatalf("observer over TLS: %v", err)
	}
	nc.Close()
	if nc, err := nats.Connect(url, nats.RootCAs(ca)); err == nil {
		nc.Close()
		t.Fatal("an anonymous TLS client connected")
	}
}

// writeCert writes a self-signed certificate for 127.0.0.1 as server.pem,
// server-key.pem and ca.pem, and returns the ca.pem path.
func writeCert(t *testing.T, dir string) string {
	t.Helper()
	cert, key, _ := testkit.SelfSigned(t)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"server.pem": cert, "ca.pem": cert, "server-key.pem": key} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "ca.pem")
}
