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
)

const authUsage = `usage:
  switchyard auth init DIR [--tenants a,b] [--replicas x,y]
  switchyard auth creds DIR --role gateway|broker|operator|observer [--out FILE]
  switchyard auth creds DIR --role adapter --replica ID [--out FILE]
  switchyard auth creds DIR --role tenant --tenant T [--out FILE]
  switchyard auth revoke DIR --role ROLE [--replica ID | --tenant T] [--nats URL]`

// runAuth generates and manages the NATS authorization (docs/security.md).
func runAuth(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usagef("%s", authUsage)
	}
	switch args[0] {
	case "init":
		return runAuthInit(args[1:], stdout)
	case "creds":
		return runAuthCreds(args[1:], stdout)
	case "revoke":
		return runAuthRevoke(ctx, args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprintln(stdout, authUsage)
		return nil
	}
	return usagef("unknown auth command %q\n%s", args[0], authUsage)
}

func runAuthInit(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("auth init", flag.ContinueOnError)
	tenants := fs.String("tenants", "", "comma-separated tenants that get an account for direct NATS clients")
	replicas := fs.String("replicas", "", "comma-separated replica ids that get an adapter creds file")
	prefix := fs.String("prefix", "", "subject prefix (default llm)")
	bucket := fs.String("bucket", "", "routing-table KV bucket (default llm-routing)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("%s", authUsage)
	}
	dir := pos[0]
	ids := splitList(*replicas)
	store, err := auth.Init(dir, auth.Config{Prefix: *prefix, Bucket: *bucket, Tenants: splitList(*tenants), Replicas: ids})
	if err != nil {
		return err
	}
	credsDir := filepath.Join(dir, "creds")
	if err := store.WriteAllCreds(credsDir, ids); err != nil {
		return err
	}
	fmt.Fprintf(stdout, `NATS authorization in %s
  server config  %s   (include it in nats-server.conf; see deploy/nats/)
  creds          %s/   (one per identity; give each part only its own)
  keys           %s/{operator,accounts,users}   (keep private)
`, dir, store.ServerConfigPath(), credsDir, dir)
	return nil
}

// roleFlags are --role, --replica and --tenant.
type roleFlags struct{ kind, replica, tenant string }

func (r *roleFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&r.kind, "role", "", "gateway, broker, operator, observer, adapter or tenant")
	fs.StringVar(&r.replica, "replica", "", "replica id (role adapter)")
	fs.StringVar(&r.tenant, "tenant", "", "tenant (role tenant)")
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
	if err != nil {
		return auth.Role{}, usageError{err}
	}
	return role, nil
}

func runAuthCreds(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("auth creds", flag.ContinueOnError)
	var rf roleFlags
	rf.register(fs)
	out := fs.String("out", "", "write the creds file here (mode 0600) instead of stdout")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("%s", authUsage)
	}
	role, err := rf.role()
	if err != nil {
		return err
	}
	store, err := auth.Open(pos[0])
	if err != nil {
		return err
	}
	b, err := store.Creds(role)
	if err != nil {
		return err
	}
	if *out == "" {
		_, err = stdout.Write(b)
		return err
	}
	return os.WriteFile(*out, b, 0o600)
}

func runAuthRevoke(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("auth revoke", flag.ContinueOnError)
	var rf roleFlags
	rf.register(fs)
	var nf natsFlags
	nf.register(fs)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("%s", authUsage)
	}
	role, err := rf.role()
	if err != nil {
		return err
	}
	store, err := auth.Open(pos[0])
	if err != nil {
		return err
	}
	accountPub, accountJWT, err := store.Revoke(role)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "revoked %s: every creds file of it issued until now is refused\n", role.Name())
	if nf.opts.URL == "" && os.Getenv("NATS_URL") == "" {
		fmt.Fprintf(stderr, "no --nats given: the updated %s reaches servers on their next restart or reload; pass --nats to push it now\n", store.ServerConfigPath())
		return nil
	}
	// The update goes in as the system account's user, which is the only
	// identity servers take account JWTs from.
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
