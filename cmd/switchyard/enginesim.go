package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/switchyard-llm/switchyard/enginesim"
	"github.com/switchyard-llm/switchyard/internal/check"
	"github.com/switchyard-llm/switchyard/internal/kvevents"
	"github.com/switchyard-llm/switchyard/internal/listen"
)

func runEngineSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("engine-sim", flag.ContinueOnError)
	var cfg enginesim.ServerConfig
	listenAddr := fs.String("listen", "127.0.0.1:8000", "HTTP listen address, or fd:N for an inherited listening socket")
	fs.StringVar(&cfg.Engine.Model, "model", "", "served model name")
	fs.IntVar(&cfg.Engine.KVBlocks, "kv-blocks", 8192, "KV-cache blocks of 16 tokens (at most 16777216)")
	fs.IntVar(&cfg.Engine.MaxBatch, "max-batch", 32, "continuous-batching limit (at most 65536)")
	fs.IntVar(&cfg.Engine.MaxQueue, "max-queue", 128, "waiting-queue limit (at most 1048576)")
	fs.IntVar(&cfg.Engine.MaxLoras, "max-loras", 0, "LoRA slots (0: none, or one when --adapters is set; at most 1024)")
	adapters := fs.String("adapters", "", "comma-separated LoRA adapters it can serve")
	fs.DurationVar(&cfg.Engine.KVTransferPerToken, "kv-transfer-per-token", 0, "cost of a prompt token a decode leg pulls from a remote prefill (0: 10µs; at most 1s)")
	fs.DurationVar(&cfg.KVHold, "kv-hold", enginesim.DefaultKVHold, "how long a prefill leg's KV blocks wait for their decode leg (at most 1h)")
	fs.Float64Var(&cfg.Speed, "speed", 1, "time scale (2 = twice as fast; at most 1e6)")
	scheduling := fs.String("scheduling-policy", "fcfs", "fcfs, or priority: serve the queue by each request's priority field (lower first), as vLLM's --scheduling-policy")
	fs.BoolVar(&cfg.DeterministicText, "deterministic-text", false, "answer every prompt with the same word sequence, continuing one a prompt ends with")
	var kv kvevents.PublisherConfig
	fs.StringVar(&kv.Endpoint, "kv-events", "", "publish KV-cache events as vLLM does on a ZMQ PUB socket bound here, e.g. tcp://127.0.0.1:5557 (empty: off)")
	kvDial := fs.String("kv-events-dial", "", "publish KV-cache events by dialing a subscriber that binds here, as an engine that dials out")
	fs.StringVar(&kv.Replay, "kv-events-replay", "", "ZMQ ROUTER address that resends missed event batches, e.g. tcp://127.0.0.1:5558")
	fs.StringVar(&kv.Topic, "kv-events-topic", "kv-events", "topic frame of every event message")
	kvFormat := fs.String("kv-events-format", "array", "event encoding: array (events as tagged arrays, older vLLM) or map (events with a type member)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if _, err := parseArgs(fs, args); err != nil {
		return err
	}
	cfg.Engine.Scheduling = enginesim.Scheduling(*scheduling)
	format, formatErr := kvevents.ParseFormat(*kvFormat)
	var dialErr error
	if *kvDial != "" && kv.Endpoint != "" {
		dialErr = check.Wrap("kv-events-dial", *kvDial, errors.New("set --kv-events or --kv-events-dial, not both"))
	}
	if err := checked(cfg.Validate(), check.Required("model", cfg.Engine.Model), checkLogLevel(*logLevel),
		check.Wrap("kv-events-format", *kvFormat, formatErr), dialErr); err != nil {
		return err
	}
	kv.Format = format
	if *kvDial != "" {
		kv.Endpoint, kv.Dial = *kvDial, true
	}
	if *adapters != "" {
		cfg.Adapters = strings.Split(*adapters, ",")
	}
	cfg.Logger = newLogger(stderr, *logLevel)
	eng := enginesim.NewServer(cfg)
	if kv.Endpoint != "" {
		p, err := eng.PublishKVEvents(kv)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "engine-sim publishing KV-cache events on %s (replay %q)\n", p.Addr(), p.ReplayAddr())
	}
	ln, err := listen.Listen(*listenAddr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "engine-sim serving %s on http://%s\n", cfg.Engine.Model, ln.Addr())
	return eng.Serve(ctx, ln)
}
