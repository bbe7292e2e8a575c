package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/switchyard-llm/switchyard/loadgen"
)

// runBench is an open-loop load generator for this machine: each target is
// sent --rate requests a second on a fixed schedule, the targets
// interleaved slot by slot, and latency is counted from the scheduled send.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var cfg loadgen.Config
	target := fs.String("target", "", "URL to measure (loopback only; no path = /v1/chat/completions)")
	var compare []string
	fs.Func("compare", "another URL measured in the same run, interleaved (repeatable)", func(s string) error {
		compare = append(compare, s)
		return nil
	})
	names := fs.String("names", "", "comma-separated labels for the target and each --compare")
	fs.Float64Var(&cfg.Rate, "rate", 100, "requests per second sent to each target (at most 1e6)")
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "length of the measured schedule (0: --requests only; at most 24h)")
	fs.IntVar(&cfg.Requests, "requests", 0, "measured requests per target (0: rate × duration)")
	fs.DurationVar(&cfg.Warmup, "warmup", time.Second, "schedule run before measuring, not counted (at most 1h)")
	fs.BoolVar(&cfg.Stream, "stream", false, "ask for server-sent events and measure the gaps between chunks")
	fs.IntVar(&cfg.MaxTokens, "max-tokens", 8, "max_tokens of each request (at most 1048576)")
	fs.StringVar(&cfg.Model, "model", "llama-3-8b-instruct", "model of each request")
	fs.DurationVar(&cfg.Timeout, "timeout", 30*time.Second, "deadline of each request from its send (at most 1h)")
	jsonOut := fs.String("json", "", "also write the report as JSON to this file (- for stdout)")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	if _, err := parseArgs(fs, args); err != nil {
		return err
	}
	if *target != "" {
		cfg.Targets = append([]string{*target}, compare...)
	}
	if err := checked(cfg.Validate()); err != nil {
		return err
	}
	if *names != "" {
		cfg.Names = strings.Split(*names, ",")
	}
	if !*quiet {
		cfg.Progress = stderr
	}
	rep, err := loadgen.Run(ctx, cfg)
	if rep == nil {
		if errors.Is(err, loadgen.ErrNotLoopback) {
			return usageError{err}
		}
		return err
	}
	if werr := rep.WriteText(stdout); werr != nil {
		return werr
	}
	if *jsonOut != "" {
		if jerr := writeReportJSON(rep, *jsonOut, stdout); jerr != nil {
			return jerr
		}
	}
	if err != nil {
		return fmt.Errorf("interrupted: %w", err)
	}
	return nil
}

func writeReportJSON(rep *loadgen.Report, path string, stdout io.Writer) error {
	if path == "-" {
		return rep.WriteJSON(stdout)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := rep.WriteJSON(f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
