package main

import (
	"context"
	"flag"
	"io"
	"sync"

	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/table"
	"github.com/switchyard-llm/switchyard/ui"
)

func runGateway(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	var nf natsFlags
	nf.register(fs)
	listen := fs.String("listen", ":8080", "HTTP listen address")
	maxBody := fs.String("max-body", "8MiB", "largest request body")
	stateDir := fs.String("state-dir", "", "directory for the last good routing table")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if _, err := parseArgs(fs, args); err != nil {
		return err
	}
	mb, err := parseSize(*maxBody)
	if err != nil {
		return usagef("--max-body: %v", err)
	}
	log := newLogger(stderr, *logLevel)
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
	g, err = gateway.New(nc, gateway.Config{
		Listen: *listen, Prefix: nf.prefix, Bucket: nf.bucket, StateDir: *stateDir,
		MaxBody: mb, Logger: log, Registerer: reg, Gatherer: reg,
		Extra: dash.Mounts(),
	})
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
