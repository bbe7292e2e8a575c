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
	"errors"
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
	decide     string // the gateways' --decide: local, broker, or mixed (the first local, the others broker)
	brokers    int
	faults     bool     // parts are killed and restarted on commands read from stdin
	netns      string   // namespaces and links are named with it; "": everything on loopback
	net        *network // the namespaces, with netns
}

func main() {
	var cfg config
	flag.StringVar(&cfg.dir, "dir", ".cache/cluster", "directory for configs, certificates, data and logs (emptied first)")
	flag.StringVar(&cfg.root, "root", ".", "repository root")
	flag.StringVar(&cfg.switchyard, "switchyard", "bin/switchyard", "the switchyard binary")
	flag.StringVar(&cfg.natsServer, "nats-server", ".cache/tools/nats-server", "the nats-server binary")
	flag.IntVar(&cfg.gateways, "gateways", 2, "gateways to run")
	flag.IntVar(&cfg.brokers, "brokers", 2, "brokers to run")
	flag.StringVar(&cfg.decide, "gateway-decide", "local", "where the gateways decide: local, broker, or mixed (gateway-1 local, the others through the brokers)")
	flag.BoolVar(&cfg.faults, "faults", false, "read `kill|term|stop|cont|start|cut|heal PART` lines from stdin (PART as in the pids file), answer `ok` or `error: …`; a part that exits does not end the run")
	flag.StringVar(&cfg.netns, "netns", "", "run each NATS server, the GPU site, each broker and each gateway in a network namespace of its own, named with this prefix, joined by bridges (root; `cut PART` sets its link down)")
	clean := flag.Bool("netns-clean", false, "only delete the namespaces and links a run with -netns left, and exit")
	flag.Parse()
	switch cfg.decide {
	case "local", "broker", "mixed":
	default:
		fmt.Fprintf(os.Stderr, "cluster: -gateway-decide %q: want local, broker or mixed\n", cfg.decide)
		os.Exit(2)
	}
	if cfg.netns != "" && !validPrefix(cfg.netns) {
		fmt.Fprintf(os.Stderr, "cluster: -netns %q: a prefix is 2 to 8 lowercase letters and digits, starting with a letter\n", cfg.netns)
		os.Exit(2)
	}
	if *clean {
		if cfg.netns == "" {
			fmt.Fprintln(os.Stderr, "cluster: -netns-clean needs -netns PREFIX")
			os.Exit(2)
		}
		if err := cleanNetwork(cfg.netns); err != nil {
			fmt.Fprintln(os.Stderr, "cluster: -netns-clean:", err)
			os.Exit(1)
		}
		return
	}
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
	if cfg.netns != "" {
		parts := []string{"nats-1", "nats-2", "nats-3", siteName}
		for i := range cfg.brokers {
			parts = append(parts, fmt.Sprintf("broker-%d", i+1))
		}
		for i := range cfg.gateways {
			parts = append(parts, fmt.Sprintf("gateway-%d", i+1))
		}
		if cfg.net, err = setupNetwork(cfg.netns, parts); err != nil {
			return errors.Join(err, cleanNetwork(cfg.netns))
		}
		// Deferred first, so done after every process has stopped.
		defer func() {
			if cerr := cleanNetwork(cfg.netns); cerr != nil && err == nil {
				err = cerr
			}
		}()
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
	fmt.Fprintf(stdout, "monitor: %s   (each NATS server's monitoring, in the order of NATS)\n", strings.Join(n.monitors, ","))
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
		go control(stdin, stdout, procs, cfg.net) // ends with stdin; the process exits after run
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-procs.exited:
		return err
	}
}

// control carries out the fault commands read from in, one a line.
func control(in io.Reader, out io.Writer, procs *procs, net *network) {
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
		case "cut": // partitioned: its link drops every packet
			err = net.cut(name)
		case "heal":
			err = net.heal(name)
		default:
			err = fmt.Errorf("unknown command %q (kill, term, stop, cont, start, cut or heal PART)", verb)
		}
		if err != nil {
			fmt.Fprintf(out, "error: %v\n", err)
			continue
		}
		fmt.Fprintf(out, "ok %s %s\n", verb, name)
	}
}
