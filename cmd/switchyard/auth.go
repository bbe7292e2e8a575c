package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/switchyard-llm/switchyard/auth"
	"github.com/switchyard-llm/switchyard/natsconn"
)

const authUsage = `usage: switchyard auth init DIR [--tenants a,b] [--replicas x,y]
       switchyard auth creds DIR --role gateway|gateway-relay|broker|operator|observer|loader|batcher [--out FILE]
       switchyard auth creds DIR --role gateway|gateway-relay|broker --region R [--out FILE]
       switchyard auth creds DIR --role adapter --replica ID [--out FILE]
       switchyard auth creds DIR --role tenant --tenant T [--out FILE]
       switchyard auth revoke DIR --role ROLE [--replica ID | --tenant T] [--nats URL]`

// runAuth generates and manages the NATS authorization (docs/security.md).
func runAuth(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("auth", flag.ContinueOnError)
	tenants := fs.String("tenants", "", "init: comma-separated tenants that get an account for direct NATS clients")
	replicas := fs.String("replicas", "", "init: comma-separated replica ids that get an adapter creds file")
	var rf roleFlags
	rf.register(fs)
	out := fs.String("out", "", "creds: write the creds file here (mode 0600) instead of stdout")
	var nf natsFlags
	nf.register(fs)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := checked(nf.validate()); err != nil {
		return err
	}
	if len(pos) != 2 {
		return usagef("%s", authUsage)
	}
	verb, dir := pos[0], pos[1]
	switch verb {
	case "init":
		cfg := auth.Config{Tenants: splitList(*tenants), Replicas: splitList(*replicas)}
		// Only prefixes and buckets given here; a store remembers its own.
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "prefix":
				cfg.Prefix = nf.prefix
			case "bucket":
				cfg.Bucket = nf.bucket
			}
		})
		return authInit(dir, cfg, stdout)
	case "creds":
		role, err := rf.role()
		if err != nil {
			return err
		}
		return authCreds(dir, role, *out, stdout)
	case "revoke":
		if rf.region != "" {
			// A role's user key is one for every region: revoking it
			// revokes them all.
			return usagef("--region applies to creds only: revoke --role %s revokes that role's creds in every region", rf.kind)
		}
		role, err := rf.role()
		if err != nil {
			return err
		}
		return authRevoke(ctx, dir, role, nf, stdout, stderr)
	}
	return usagef("unknown auth command %q\n%s", verb, authUsage)
}

func authInit(dir string, cfg auth.Config, stdout io.Writer) error {
	store, err := auth.Init(dir, cfg)
	if err != nil {
		return err
	}
	credsDir := filepath.Join(dir, "creds")
	if err := store.WriteAllCreds(credsDir, cfg.Replicas); err != nil {
		return err
	}
	fmt.Fprintf(stdout, `NATS authorization in %s
  server config  %s   (include it in nats-server.conf; see deploy/nats/)
  creds          %s/   (one per identity; give each part only its own)
  keys           %s/{operator,accounts,users}   (keep private)
`, dir, store.ServerConfigPath(), credsDir, dir)
	return nil
}

// roleFlags are --role, --replica, --tenant and --region.
type roleFlags struct{ kind, replica, tenant, region string }

func (r *roleFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&r.kind, "role", "", "gateway (deciding, gateway --decide local), gateway-relay (gateway --decide broker), broker, operator, observer, loader, batcher, adapter or tenant")
	fs.StringVar(&r.replica, "replica", "", "replica id (role adapter)")
	fs.StringVar(&r.tenant, "tenant", "", "tenant (role tenant)")
	fs.StringVar(&r.region, "region", "", "region of a gateway, gateway-relay or broker run with --region: it may also read the region's copy of the routing table")
}

func (r *roleFlags) role() (auth.Role, error) {
	if r.replica != "" && r.tenant != "" {
		return auth.Role{}, usagef("--replica and --tenant exclude each other")
	}
	id := r.replica
	if r.kind == auth.RoleTenant || r.tenant != "" {
		id = r.tenant
	}
	role, err := auth.ParseRole(r.kind, id)
	if err == nil && r.region != "" {
		role, err = role.InRegion(r.region)
	}
	if err != nil {
		return auth.Role{}, usageError{err}
	}
	return role, nil
}

func authCreds(dir string, role auth.Role, out string, stdout io.Writer) error {
	store, err := auth.Open(dir)
	if err != nil {
		return err
	}
	b, err := store.Creds(role)
	if err != nil {
		return err
	}
	if out == "" {
		_, err = stdout.Write(b)
		return err
	}
	return os.WriteFile(out, b, 0o600)
}

func authRevoke(ctx context.Context, dir string, role auth.Role, nf natsFlags, stdout, stderr io.Writer) error {
	store, err := auth.Open(dir)
	if err != nil {
		return err
	}
	accountPub, accountJWT, err := store.Revoke(role)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "revoked %s: every creds file of it issued until now is refused\n", role.Name())
	if nf.opts.URL == "" && os.Getenv(natsconn.EnvURL) == "" {
		fmt.Fprintf(stderr, "no --nats given: the updated %s reaches servers on their next restart or reload; pass --nats to push it now\n", store.ServerConfigPath())
		return nil
	}
	// The update goes in as the system account's user, the only identity
	// servers take account JWTs from.
	if nf.opts.Creds == "" {
		nf.opts.Creds = store.SystemCredsPath()
	}
	nf.opts.Context = ""
	nc, err := nf.connectOnce(ctx, "switchyard-auth")
	if err != nil {
		return err
	}
	defer nc.Close()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := auth.PushAccount(cctx, nc, accountPub, accountJWT); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "pushed the account to %s\n", nc.ConnectedUrlRedacted())
	return nil
}

func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
