package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/internal/telemetry"
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
	fs.StringVar(&cfg.Region, "region", "", "region the replica serves in, carried in its heartbeats (default: none, the one region of a deployment without regions)")
	fs.StringVar(&cfg.Flavor, "flavor", "auto", "engine metrics flavor: auto, vllm, sglang, llamacpp or tgi")
	fs.StringVar(&cfg.EngineScheduling, "engine-scheduling", "fcfs", "the engine's scheduling policy: fcfs, or priority for a vLLM started with --scheduling-policy priority (the adapter then sends each request's priority: batch work 1, interactive 0)")
	fs.IntVar(&cfg.MaxBatch, "max-batch", 0, "requests the engine runs at once (vLLM's max_num_seqs; 0: read from the engine where it exports it, else 256; at most 65536)")
	fs.IntVar(&cfg.MaxQueue, "max-queue", 0, "waiting requests weighed as a full queue (0: 1024; at most 1048576)")
	fs.IntVar(&cfg.MaxLoras, "max-loras", 0, "LoRA slots (0: as the engine reports; at most 1024)")
	fs.StringVar(&cfg.Role, "pd-role", "both", "what the replica serves of a disaggregated model: prefill, decode or both")
	fs.StringVar(&cfg.KVEvents, "kv-events", "", "engine's KV-cache event PUB socket to connect to, e.g. tcp://127.0.0.1:5557 (vLLM's --kv-events-config endpoint; empty: no feed)")
	fs.StringVar(&cfg.KVEventsBind, "kv-events-bind", "", "bind a SUB socket here for an engine that dials out, e.g. tcp://0.0.0.0:5557")
	fs.StringVar(&cfg.KVEventsTopic, "kv-events-topic", "", "KV-event topic prefix to subscribe to (default: all)")
	fs.StringVar(&cfg.KVEventsReplay, "kv-events-replay", "", "engine's replay (ROUTER) socket, asked for missed batches, e.g. tcp://127.0.0.1:5558")
	fs.IntVar(&cfg.KVBlocks, "kv-blocks", 0, "engine's KV capacity in blocks, told to brokers (0: read vLLM's cache_config_info; at most 16777216)")
	fs.Var(listFlag{&cfg.Endpoints}, "endpoint", "an API `path` the engine serves, e.g. /v1/responses (repeatable; default: the flavor's: all for vLLM, no /v1/responses for llama.cpp, SGLang, TGI)")
	fs.DurationVar(&cfg.DrainGrace, "drain-grace", adapter.DefaultDrainGrace, "how long in-flight requests may run after SIGTERM (0: none; at most 1h)")
	keyFile := fs.String("engine-api-key-file", "", "file holding the engine's API key, sent as a bearer token (else $"+engineKeyEnv+")")
	metricsListen := fs.String("metrics-listen", "", "address (or fd:N, an inherited listening socket) of the /metrics listener (default: none)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if _, err := parseArgs(fs, args); err != nil {
		return err
	}
	if cfg.DrainGrace == 0 {
		cfg.DrainGrace = -1 // none, asked for explicitly
	}
	cfg.Prefix, cfg.Bucket = nf.prefix, nf.bucket
	if err := checked(nf.validate(), cfg.Validate(), checkLogLevel(*logLevel)); err != nil {
		return err
	}
	key, err := engineAPIKey(*keyFile)
	if err != nil {
		return usageError{err}
	}
	cfg.EngineAPIKey = key
	log := newLogger(stderr, *logLevel)
	tracing, stopTracing, err := startTracing(ctx, telemetry.ServiceAdapter, log)
	if err != nil {
		return err
	}
	defer stopTracing()
	return runPart(ctx, &nf, "switchyard-adapter-"+cfg.Replica, log, *metricsListen, func(nc *nats.Conn, reg *prometheus.Registry) (part, error) {
		cfg.Logger, cfg.Registerer, cfg.TracerProvider = log, reg, tracing.Provider()
		return adapter.New(nc, cfg)
	})
}

// engineKeyEnv names the environment variable holding the engine's API key.
const engineKeyEnv = "SWITCHYARD_ENGINE_API_KEY"

// engineAPIKey reads the engine's API key from file, else from the
// environment. There is no flag for the key itself: a flag shows in ps and
// in shell history.
func engineAPIKey(file string) (string, error) {
	if file == "" {
		return strings.TrimSpace(os.Getenv(engineKeyEnv)), nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("--engine-api-key-file: %w", err)
	}
	key := strings.TrimSpace(string(b))
	if key == "" || strings.ContainsAny(key, "\r\n") {
		return "", fmt.Errorf("--engine-api-key-file %s: want one line holding the key", file)
	}
	return key, nil
}
