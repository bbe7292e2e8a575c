package main

import (
	"context"
	"flag"
	"io"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/batch"
)

func runBatcher(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("batcher", flag.ContinueOnError)
	var nf natsFlags
	nf.register(fs)
	var cfg batch.Config
	fs.StringVar(&cfg.ID, "id", "", "batcher id (default: random)")
	fs.IntVar(&cfg.Concurrency, "concurrency", batch.DefaultConcurrency, "batch lines in flight at most; below it the batcher paces on the pool's free room in the load view (at most 65536)")
	fs.DurationVar(&cfg.AckWait, "ack-wait", batch.DefaultAckWait, "how long the lines a vanished batcher held wait before another takes them (at most 1h)")
	fs.DurationVar(&cfg.RequestTimeout, "request-timeout", batch.DefaultRequestTimeout, "longest one line's request may take (at most 24h)")
	fs.IntVar(&cfg.Replicas, "kv-replicas", 1, "replicas of the stream and buckets the batcher creates (1 to 5)")
	metricsListen := fs.String("metrics-listen", ":9104", "address (or fd:N, an inherited listening socket) of the /metrics listener")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if _, err := parseArgs(fs, args); err != nil {
		return err
	}
	cfg.Prefix = nf.prefix
	if err := checked(nf.validate(), cfg.Validate(), checkLogLevel(*logLevel)); err != nil {
		return err
	}
	log := newLogger(stderr, *logLevel)
	return runPart(ctx, &nf, "switchyard-batcher", log, *metricsListen, func(nc *nats.Conn, reg *prometheus.Registry) (part, error) {
		cfg.Logger, cfg.Registerer = log, reg
		return batch.New(nc, cfg)
	})
}
