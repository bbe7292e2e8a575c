package auth

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sort"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/natsconn"
)

// writeServerConfig writes the nats-server configuration fragment: the
// operator, the system account, the control line the credentials need
// (natsconn.MaxControlLine) and a memory resolver preloaded with every
// account JWT. deploy/nats/nats-server.conf includes it.
func (s *Store) writeServerConfig(operatorJWT, sysPub string) error {
	jwts, err := s.AccountJWTs()
	if err != nil {
		return err
	}
	keys := make([]string, 0, len(jwts))
	for k := range jwts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "# Switchyard authorization, written by `switchyard auth`. Do not edit: re-run\n")
	fmt.Fprintf(&b, "# `switchyard auth init` (more tenants) or `switchyard auth revoke` instead.\n")
	fmt.Fprintf(&b, "operator: %s\n", operatorJWT)
	fmt.Fprintf(&b, "system_account: %s\n", sysPub)
	// A client's CONNECT line carries its user JWT, permissions and all:
	// a deciding gateway's, with a region, is longer than the default 4 KB.
	fmt.Fprintf(&b, "max_control_line: %d\n", natsconn.MaxControlLine)
	// A memory resolver holds the preloaded JWTs; `switchyard auth revoke
	// --nats` pushes a changed one to running servers, and this file,
	// rewritten with it, carries it across a restart.
	fmt.Fprintf(&b, "resolver: MEMORY\n")
	fmt.Fprintf(&b, "resolver_preload: {\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "  %s: %s\n", k, jwts[k])
	}
	fmt.Fprintf(&b, "}\n")
	return writeFile(filepath.Join(s.dir, ServerConfigFile), strings.TrimSuffix(b.String(), "\n"))
}

// ServerConfigPath is the fragment Init writes.
func (s *Store) ServerConfigPath() string { return filepath.Join(s.dir, ServerConfigFile) }

// PushAccount sends an account JWT to the servers nc (a system-account
// connection) reaches, as `nats-server` expects account updates, and
// returns once one server accepted it.
func PushAccount(ctx context.Context, nc *nats.Conn, accountPub, accountJWT string) error {
	msg, err := nc.RequestWithContext(ctx, "$SYS.REQ.ACCOUNT."+accountPub+".CLAIMS.UPDATE", []byte(accountJWT))
	if err != nil {
		return fmt.Errorf("pushing account %s: %w", accountPub, err)
	}
	var resp struct {
		Data *struct {
			Message string `json:"message"`
		} `json:"data"`
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return fmt.Errorf("pushing account %s: %w", accountPub, err)
	}
	if resp.Error != nil {
		return fmt.Errorf("pushing account %s: %s", accountPub, resp.Error.Description)
	}
	return nil
}

// Trust is the store's authorization for an embedded server.
func (s *Store) Trust() (*natsconn.Trust, error) {
	oc, sys, err := s.Operator()
	if err != nil {
		return nil, err
	}
	jwts, err := s.AccountJWTs()
	if err != nil {
		return nil, err
	}
	return &natsconn.Trust{Operator: oc, SystemAccount: sys, Accounts: jwts}, nil
}
