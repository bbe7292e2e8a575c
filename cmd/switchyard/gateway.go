package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/switchyard-llm/switchyard/batch"
	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/check"
	"github.com/switchyard-llm/switchyard/internal/telemetry"
	"github.com/switchyard-llm/switchyard/table"
	"github.com/switchyard-llm/switchyard/ui"
)

func runGateway(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	var nf natsFlags
	nf.register(fs)
	var cfg gateway.Config
	fs.StringVar(&cfg.Listen, "listen", ":8080", "HTTP listen address (or fd:N, an inherited listening socket): the API, /healthz and /readyz")
	fs.StringVar(&cfg.AdminListen, "admin-listen", gateway.DefaultAdminListen, "address (or fd:N, an inherited listening socket) of the dashboard (/ui) and /metrics; keep it private")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "PEM certificate `file`: serve HTTPS (and HTTP/2) on --listen")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "PEM private key `file` of --tls-cert")
	fs.DurationVar(&cfg.BodyTimeout, "body-timeout", gateway.DefaultBodyTimeout, "time a request body may take to arrive in full (at most 1h; the response is not bounded by it)")
	fs.DurationVar(&cfg.HeaderTimeout, "header-timeout", gateway.DefaultHeaderTimeout, "time a request's headers may take to arrive (at most 1h); then the connection is closed")
	fs.DurationVar(&cfg.KeepAliveTimeout, "keepalive-timeout", gateway.DefaultKeepAliveTimeout, "time a keep-alive client connection may sit idle between requests (at most 1h); then it is closed")
	fs.IntVar(&cfg.MaxConns, "max-conns", gateway.DefaultMaxConns, "open client connections at most; one more is refused at once (at most 1048576)")
	fs.IntVar(&cfg.MaxInflight, "max-inflight", 0, "open inference requests at most, accepted or not: a hard ceiling over the adaptive limit on those not yet accepted; one more is refused 503 gateway_overloaded before its body is read (0: the adaptive limit only; at most 1048576)")
	sizeVar(fs, &cfg.MaxBody, "max-body", 0,
		"largest request body `size`, e.g. 512KiB (0: "+check.FormatSize(gateway.DefaultMaxBody)+", or what the NATS server carries when less; at most "+check.FormatSize(gateway.MaxBodyCeiling)+" and what the NATS server carries)")
	sizeVar(fs, &cfg.MaxFileBytes, "max-file-bytes", batch.DefaultMaxFileBytes, "largest file `size` uploaded to /v1/files (--max-body does not apply there; at most "+check.FormatSize(gateway.MaxFileBytesCeiling)+")")
	fs.IntVar(&cfg.MaxFileLines, "max-file-lines", batch.DefaultMaxFileLines, "most lines of a file uploaded to /v1/files (at most 10000000)")
	fs.IntVar(&cfg.BatchReplicas, "batch-replicas", 1, "replicas of the llm-files object store and the llm-batches bucket, when the gateway creates them (1 to 5)")
	fs.IntVar(&cfg.MaxRetries, "max-retries", 2, fmt.Sprintf("other replicas tried after a failed attempt (0: none; at most %d)", gateway.MaxRetriesCeiling))
	fs.DurationVar(&cfg.ShutdownGrace, "shutdown-grace", 30*time.Second, "how long in-flight requests may run after SIGTERM (at most 1h)")
	fs.DurationVar(&cfg.OfflineWait, "offline-wait", gateway.DefaultOfflineWait, "how long a request whose attempt failed with the gateway's NATS link, before any replica accepted it, waits for the link to carry again (reconnected, not silent) and goes through it, before 503 router_unavailable (-1s: not at all; at most 1m); a new request on a link that is down is answered at once; a request whose replicas left the bus under it (nothing listening on them) waits as long for them to reconnect")
	fs.DurationVar(&cfg.RoutedTimeout, "routed-timeout", gateway.DefaultRoutedTimeout, "time without a broker's routed notice after which the request is sent to the broker queue group again as a copy (-1s: never; at most 1m)")
	fs.DurationVar(&cfg.ProbeAfter, "probe-after", gateway.DefaultProbeAfter, "silence of a reply after which the gateway asks NATS whether its replica's adapter is still there (-1s: never; at most 1h)")
	fs.StringVar(&cfg.StateDir, "state-dir", "", "directory for the last good routing table")
	fs.StringVar(&cfg.Region, "region", "", "region this gateway decides in with --decide local: its replicas first, spilling by the table's policy.regions (default: none, every replica alike)")
	fs.StringVar(&cfg.Decide, "decide", gateway.DecideLocal, "where HTTP requests are decided: local (in this process, the body published once straight to the replica) or broker (through the brokers, llm.gw.<tenant>)")
	warmUpVar(fs, &cfg.WarmUp, "with --decide local, before /readyz passes")
	fs.IntVar(&cfg.MaxColdWaits, "max-cold-waits", gateway.DefaultMaxColdWaits, "requests held at most while their cold model loads (on_cold: wait)")
	fs.Var(listFlag{&cfg.CORSOrigins}, "cors-origin", "browser `origin` allowed to call the gateway, e.g. https://app.example, or * for any (repeatable; default: CORS off)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if _, err := parseArgs(fs, args); err != nil {
		return err
	}
	if cfg.MaxRetries == 0 {
		cfg.MaxRetries = -1 // none, asked for explicitly
	}
	cfg.WarmUp = warmUp(cfg.WarmUp)
	adminErr := check.Required("admin-listen", cfg.AdminListen) // the dashboard never shares the public listener
	if err := checked(nf.validate(), cfg.Validate(), checkLogLevel(*logLevel), adminErr); err != nil {
		return err
	}
	log := newLogger(stderr, *logLevel)
	tracing, stopTracing, err := startTracing(ctx, telemetry.ServiceGateway, log)
	if err != nil {
		return err
	}
	defer stopTracing()
	cfg.TracerProvider = tracing.Provider()
	nc, err := nf.connect(ctx, "switchyard-gateway", log)
	if err != nil {
		return err
	}
	defer nc.Close()
	reg := newRegistry()
	// The dashboard shows the gateway's own table; g is set before either runs.
	var g *gateway.Gateway
	dash := ui.New(nc, ui.Config{
		Prefix: nf.prefix, Bucket: nf.bucket, Logger: log,
		Table: func() *table.Snapshot { return g.Table() },
	})
	cfg.Prefix, cfg.Bucket, cfg.Logger, cfg.Registerer, cfg.Gatherer = nf.prefix, nf.bucket, log, reg, reg
	cfg.Extra = dash.Mounts()
	g, err = gateway.New(nc, cfg)
	if err != nil {
		return usageError{err}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() {
		if err := dash.Run(ctx); err != nil {
			log.Error("dashboard stopped", "err", err)
		}
	})
	return g.Run(ctx)
}

// listFlag collects a flag given more than once.
type listFlag struct{ p *[]string }

func (l listFlag) String() string {
	if l.p == nil {
		return ""
	}
	return strings.Join(*l.p, ",")
}

func (l listFlag) Set(s string) error {
	*l.p = append(*l.p, s)
	return nil
}
