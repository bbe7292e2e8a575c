package main

import (
	"context"
	"flag"
	"io"

	"github.com/switchyard-llm/switchyard/loader"
)

func runLoader(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("loader", flag.ContinueOnError)
	var nf natsFlags
	nf.register(fs)
	id := fs.String("id", "", "loader id (default: random)")
	cooldown := fs.Duration("cooldown", loader.DefaultCooldown, "after a failed load, how long the next one waits")
	loadTimeout := fs.Duration("load-timeout", loader.DefaultLoadTimeout, "a load with no ready replica by then has failed")
	drainTimeout := fs.Duration("drain-timeout", loader.DefaultDrainTimeout, "how long an unloading model's requests may take to finish")
	kvReplicas := fs.Int("kv-replicas", 1, "replicas of the llm-loads bucket, when the loader creates it")
	metricsListen := fs.String("metrics-listen", ":9103", "address of the /metrics listener")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if _, err := parseArgs(fs, args); err != nil {
		return err
	}
	for name, d := range map[string]float64{"--cooldown": cooldown.Seconds(), "--load-timeout": loadTimeout.Seconds(), "--drain-timeout": drainTimeout.Seconds()} {
		if d <= 0 {
			return usagef("%s: must be positive", name)
		}
	}
	log := newLogger(stderr, *logLevel)
	nc, err := nf.connect(ctx, "switchyard-loader", log)
	if err != nil {
		return err
	}
	defer nc.Close()
	reg := newRegistry()
	l, err := loader.New(nc, loader.Config{
		ID: *id, Prefix: nf.prefix, Bucket: nf.bucket, Cooldown: *cooldown, LoadTimeout: *loadTimeout,
		DrainTimeout: *drainTimeout, ClaimReplicas: *kvReplicas, Logger: log, Registerer: reg,
	})
	if err != nil {
		return usageError{err}
	}
	stopMetrics, err := serveMetrics(*metricsListen, reg)
	if err != nil {
		return err
	}
	defer stopMetrics()
	return l.Run(ctx)
}
