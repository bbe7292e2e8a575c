package main

import (
	"context"
	"flag"
	"io"
	"time"

	adapter "github.com/switchyard-llm/switchyard/replica-adapter"
)

func runAdapter(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("adapter", flag.ContinueOnError)
	var nf natsFlags
	nf.register(fs)
	var cfg adapter.Config
	fs.StringVar(&cfg.EngineURL, "engine", "", "engine base URL, e.g. http://127.0.0.1:8000")
	fs.StringVar(&cfg.Replica, "replica", "", "replica id ([A-Za-z0-9_-]{1,64})")
	fs.StringVar(&cfg.Model, "model", "", "model id this replica serves")
	fs.StringVar(&cfg.EngineModel, "engine-model", "", "name the engine serves the model under (default --model)")
	fs.StringVar(&cfg.Version, "version", "", "model version")
	fs.StringVar(&cfg.Pool, "pool", "general", "pool")
	fs.StringVar(&cfg.Flavor, "flavor", "auto", "engine metrics flavor: auto, vllm, sglang, llamacpp or tgi")
	fs.IntVar(&cfg.MaxBatch, "max-batch", 32, "engine batch size")
	fs.IntVar(&cfg.MaxQueue, "max-queue", 128, "engine queue size")
	fs.IntVar(&cfg.MaxLoras, "max-loras", 0, "LoRA slots")
	fs.DurationVar(&cfg.DrainGrace, "drain-grace", 30*time.Second, "how long in-flight requests may run after SIGTERM")
	metricsListen := fs.String("metrics-listen", "", "address of the /metrics listener (default: none)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if _, err := parseArgs(fs, args); err != nil {
		return err
	}
	if cfg.EngineURL == "" || cfg.Replica == "" || cfg.Model == "" {
		return usagef("--engine, --replica and --model are required")
	}
	log := newLogger(stderr, *logLevel)
	nc, err := nf.connect(ctx, "switchyard-adapter-"+cfg.Replica, log)
	if err != nil {
		return err
	}
	defer nc.Close()
	reg := newRegistry()
	cfg.Prefix, cfg.Bucket, cfg.Logger, cfg.Registerer = nf.prefix, nf.bucket, log, reg
	a, err := adapter.New(nc, cfg)
	if err != nil {
		return usageError{err}
	}
	stop, err := serveMetrics(*metricsListen, reg)
	if err != nil {
		return err
	}
	defer stop()
	return a.Run(ctx)
}
