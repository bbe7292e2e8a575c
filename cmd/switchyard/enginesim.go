package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/switchyard-llm/switchyard/enginesim"
)

func runEngineSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("engine-sim", flag.ContinueOnError)
	var cfg enginesim.ServerConfig
	listen := fs.String("listen", "127.0.0.1:8000", "HTTP listen address")
	fs.StringVar(&cfg.Engine.Model, "model", "", "served model name")
	fs.IntVar(&cfg.Engine.KVBlocks, "kv-blocks", 8192, "KV-cache blocks of 16 tokens")
	fs.IntVar(&cfg.Engine.MaxBatch, "max-batch", 32, "continuous-batching limit")
	fs.IntVar(&cfg.Engine.MaxQueue, "max-queue", 128, "waiting-queue limit")
	fs.IntVar(&cfg.Engine.MaxLoras, "max-loras", 0, "LoRA slots")
	adapters := fs.String("adapters", "", "comma-separated LoRA adapters it can serve")
	fs.Float64Var(&cfg.Speed, "speed", 1, "time scale (2 = twice as fast)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if _, err := parseArgs(fs, args); err != nil {
		return err
	}
	if cfg.Engine.Model == "" {
		return usagef("--model is required")
	}
	if *adapters != "" {
		cfg.Adapters = strings.Split(*adapters, ",")
	}
	cfg.Logger = newLogger(stderr, *logLevel)
	eng := enginesim.NewServer(cfg)
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "engine-sim serving %s on http://%s\n", cfg.Engine.Model, ln.Addr())
	return eng.Serve(ctx, ln)
}
