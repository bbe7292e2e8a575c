// Command cluster runs Switchyard's production shape on one machine, each
// part its own OS process on loopback: three nats-server processes from
// deploy/nats/cluster.conf, the routing table in a three-replica bucket, two
// brokers, two gateways, and an adapter beside a simulated engine for every
// dev replica. `make cluster` runs it; Ctrl-C stops every process it started.
//
// It prints `gateway: http://127.0.0.1:PORT` for each gateway once that
// gateway answers an anonymous request, and `admin: URL/ui` for its
// dashboard and /metrics, then where the NATS URLs, CA and logs are.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
)

type config struct {
	dir        string // everything this run writes; emptied first
	root       string // the repository (deploy/ is read from it)
	switchyard string // the switchyard binary
	natsServer string // the nats-server binary
	gateways   int
	brokers    int
	faults     bool // parts are killed and restarted on commands read from stdin
}

func main() {
	var cfg config
	flag.StringVar(&cfg.dir, "dir", ".cache/cluster", "directory for configs, certificates, data and logs (emptied first)")
	flag.StringVar(&cfg.root, "root", ".", "repository root")
	flag.StringVar(&cfg.switchyard, "switchyard", "bin/switchyard", "the switchyard binary")
	flag.StringVar(&cfg.natsServer, "nats-server", ".cache/tools/nats-server", "the nats-server binary")
	flag.IntVar(&cfg.gateways, "gateways", 2, "gateways to run")
	flag.IntVar(&cfg.brokers, "brokers", 2, "brokers to run")
	flag.BoolVar(&cfg.faults, "faults", false, "read `kill|term|stop|cont|start PART` lines from stdin (PART as in the pids file), answer `ok` or `error: …`; a part that exits does not end the run")
	flag.Parse()
	// Children get SIGKILL if this process dies (Pdeathsig); the signal
	// follows the thread that started them, so that thread must live as
	// long as the process.
	runtime.LockOSThread()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, cfg, os.Stdin, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg config, stdin io.Reader, stdout io.Writer) (err error) {
	for _, p := range []*string{&cfg.dir, &cfg.root, &cfg.switchyard, &cfg.natsServer} {
		if *p, err = filepath.Abs(*p); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(cfg.dir); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(cfg.dir, "logs"), 0o755); err != nil {
		return err
	}
	procs := newProcs(filepath.Join(cfg.dir, "logs"), filepath.Join(cfg.dir, "pids"))
	procs.faults.Store(cfg.faults)
	defer func() {
		fmt.Fprintln(stdout, "stopping…")
		if serr := procs.stopAll(); serr != nil && err == nil {
			err = serr
		}
	}()
	n, err := startNATS(ctx, cfg, procs)
	if err != nil {
		return err
	}
	gateways, err := startSwitchyard(ctx, cfg, n, procs)
	if err != nil {
		return err
	}
	for _, g := range gateways {
		if err := waitGateway(ctx, g.public, procs); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "gateway: %s\n", g.public)
		fmt.Fprintf(stdout, "admin:   %s/ui   (its dashboard; /metrics)\n", g.admin)
	}
	fmt.Fprintf(stdout, `creds:   %s   (one per identity: operator.creds edits the table, observer.creds reads it)
NATS:    %s
CA:      %s
leaf:    %s   (a GPU site: %s's adapter connects here)
logs:    %s
Try:     switchyard table get policy --nats %s --tlsca %s --creds %s
Ctrl-C stops everything.
`, n.creds, n.url, n.ca, n.site, siteReplica, filepath.Join(cfg.dir, "logs"),
		n.url, n.ca, n.credsFor("operator"))
	if cfg.faults {
		go control(stdin, stdout, procs) // ends with stdin; the process exits after run
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-procs.exited:
		return err
	}
}

// control carries out the fault commands read from in, one a line.
func control(in io.Reader, out io.Writer, procs *procs) {
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		verb, name, _ := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		var err error
		switch verb {
		case "kill":
			err = procs.signal(name, syscall.SIGKILL)
		case "term":
			err = procs.signal(name, syscall.SIGTERM)
		case "stop": // frozen: its connections stay open and carry nothing
			err = procs.signal(name, syscall.SIGSTOP)
		case "cont":
			err = procs.signal(name, syscall.SIGCONT)
		case "start":
			err = procs.restart(name)
		default:
			err = fmt.Errorf("unknown command %q (kill, term, stop, cont or start PART)", verb)
		}
		if err != nil {
			fmt.Fprintf(out, "error: %v\n", err)
			continue
		}
		fmt.Fprintf(out, "ok %s %s\n", verb, name)
	}
}
