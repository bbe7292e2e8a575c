package main

import (
	"context"
	"flag"
	"io"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/loader"
)

func runLoader(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("loader", flag.ContinueOnError)
	var nf natsFlags
	nf.register(fs)
	var cfg loader.Config
	fs.StringVar(&cfg.ID, "id", "", "loader id (default: random)")
	fs.DurationVar(&cfg.Cooldown, "cooldown", loader.DefaultCooldown, "after a failed load, how long the next one waits (at most 24h)")
	fs.DurationVar(&cfg.LoadTimeout, "load-timeout", loader.DefaultLoadTimeout, "a load with no ready replica by then has failed (at most 24h)")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", loader.DefaultDrainTimeout, "how long an unloading model's requests may take to finish (at most 24h)")
	fs.IntVar(&cfg.ClaimReplicas, "kv-replicas", 1, "replicas of the llm-loads bucket, when the loader creates it (1 to 5)")
	metricsListen := fs.String("metrics-listen", ":9103", "address (or fd:N, an inherited listening socket) of the /metrics listener")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if _, err := parseArgs(fs, args); err != nil {
		return err
	}
	cfg.Prefix, cfg.Bucket = nf.prefix, nf.bucket
	if err := checked(nf.validate(), cfg.Validate(), checkLogLevel(*logLevel)); err != nil {
		return err
	}
	log := newLogger(stderr, *logLevel)
	return runPart(ctx, &nf, "switchyard-loader", log, *metricsListen, func(nc *nats.Conn, reg *prometheus.Registry) (part, error) {
		cfg.Logger, cfg.Registerer = log, reg
		return loader.New(nc, cfg)
	})
}
