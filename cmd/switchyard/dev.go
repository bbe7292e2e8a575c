package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/internal/stages"
)

func runDev(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	var cfg devstack.Config
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:8080", "gateway HTTP address, or fd:N for an inherited listening socket")
	fs.StringVar(&cfg.NATSListen, "nats-listen", "127.0.0.1:4222", "embedded NATS client address (the nats CLI connects here)")
	fs.StringVar(&cfg.DataDir, "data", "", "directory for JetStream, broker state, NATS keys (auth/) and creds (creds/) (default: a temporary directory)")
	fs.Float64Var(&cfg.Speed, "speed", 1, "time scale of the simulated engines (2 = twice as fast; at most 1e6)")
	fs.Var(listFlag{&cfg.Gateway.CORSOrigins}, "cors-origin", "browser `origin` allowed to call the gateway, or * for any (repeatable; default: CORS off)")
	fs.StringVar(&cfg.OTLPEndpoint, "otlp-endpoint", "", "OTLP collector `URL` every part exports its spans to (as OTEL_EXPORTER_OTLP_ENDPOINT; default: that variable, else no tracing)")
	stageTable := fs.Bool("stages", false, "record the stages of every request and serve the table at /stages (switchyard bench --stages reads it; docs/benchmarks.md, \"Stage budget\")")
	logLevel := fs.String("log-level", "warn", "debug, info, warn or error")
	if _, err := parseArgs(fs, args); err != nil {
		return err
	}
	if err := checked(cfg.Validate(), checkLogLevel(*logLevel)); err != nil {
		return err
	}
	cfg.Logger = newLogger(stderr, *logLevel)
	if *stageTable {
		cfg.Stages = stages.New(1)
	}
	st, err := devstack.Start(ctx, cfg)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = st.Ready(rctx)
	cancel()
	if err != nil {
		_ = st.Close()
		return err
	}
	url := st.GatewayURL()
	creds := st.CredsDir()
	fmt.Fprintf(stdout, `Switchyard dev is running.

  gateway  %s   (OpenAI API; dashboard at /ui; /metrics, /readyz; /stages with --stages)
  NATS     %s   (operator mode: every identity has a creds file in %s)

Try:

  curl -s %s/v1/chat/completions \
    -H 'Content-Type: application/json' \
    -d '{"model":"chat-large","messages":[{"role":"user","content":"Hello"}],"max_tokens":8}' -i

  nats --server %s --creds %s/operator.creds kv ls llm-routing

"model":"mixtral" is cold: its first request answers 503 model_loading and starts a
simulated load of %s; it serves after that, and unloads after 5 minutes idle.

Ctrl-C stops everything.
`, url, st.NATSURL(), creds, url, st.NATSURL(), creds, time.Duration(float64(devstack.DefaultColdLoad)/cfg.Speed).Round(100*time.Millisecond))
	<-ctx.Done()
	fmt.Fprintln(stdout, "stopping…")
	return st.Close()
}
