package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/switchyard-llm/switchyard/broker"
	"github.com/switchyard-llm/switchyard/internal/buildinfo"
	"github.com/switchyard-llm/switchyard/internal/listen"
	"github.com/switchyard-llm/switchyard/internal/telemetry"
)

func runBroker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("broker", flag.ContinueOnError)
	var nf natsFlags
	nf.register(fs)
	var cfg broker.Config
	fs.StringVar(&cfg.StateDir, "state-dir", "", "directory for the last good routing table")
	metricsListen := fs.String("metrics-listen", ":9101", "address (or fd:N, an inherited listening socket) of the /metrics listener")
	fs.StringVar(&cfg.ID, "id", "", "broker id (default: random)")
	fs.StringVar(&cfg.Region, "region", "", "region this broker decides in: its replicas first, spilling by the table's policy.regions (default: none, every replica alike)")
	warmUpVar(fs, &cfg.WarmUp, "before joining the queue group")
	fs.DurationVar(&cfg.LeaseTTL, "budget-lease-ttl", 0, "how long this broker's leases on budgets outlive it, if it dies (default 30s; 1s to 10m)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if _, err := parseArgs(fs, args); err != nil {
		return err
	}
	cfg.WarmUp = warmUp(cfg.WarmUp)
	cfg.Prefix, cfg.Bucket = nf.prefix, nf.bucket
	if err := checked(nf.validate(), cfg.Validate(), checkLogLevel(*logLevel)); err != nil {
		return err
	}
	log := newLogger(stderr, *logLevel)
	tracing, stopTracing, err := startTracing(ctx, telemetry.ServiceBroker, log)
	if err != nil {
		return err
	}
	defer stopTracing()
	return runPart(ctx, &nf, "switchyard-broker", log, *metricsListen, func(nc *nats.Conn, reg *prometheus.Registry) (part, error) {
		cfg.Logger, cfg.Registerer, cfg.TracerProvider = log, reg, tracing.Provider()
		return broker.New(nc, cfg)
	})
}

// part is a long-running part of Switchyard: a broker, an adapter, a loader.
type part interface{ Run(context.Context) error }

// runPart connects to NATS as name, builds the part with a fresh registry,
// serves that registry's /metrics on metricsAddr and runs the part until
// ctx ends.
func runPart(ctx context.Context, nf *natsFlags, name string, log *slog.Logger, metricsAddr string,
	build func(*nats.Conn, *prometheus.Registry) (part, error)) error {
	nc, err := nf.connect(ctx, name, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	reg := newRegistry()
	p, err := build(nc, reg)
	if err != nil {
		return err
	}
	stopMetrics, err := serveMetrics(metricsAddr, reg)
	if err != nil {
		return err
	}
	defer stopMetrics()
	return p.Run(ctx)
}

// newRegistry is a fresh Prometheus registry with the process collectors and
// switchyard_build_info.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildinfo.Read().Collector())
	return reg
}

// serveMetrics serves /metrics on addr until the returned stop is called.
func serveMetrics(addr string, g prometheus.Gatherer) (func(), error) {
	if addr == "" {
		return func() {}, nil
	}
	ln, err := listen.Listen(addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = err
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}
