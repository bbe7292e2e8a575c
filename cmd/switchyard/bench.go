package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/switchyard-llm/switchyard/internal/stages"
	"github.com/switchyard-llm/switchyard/loadgen"
)

// runBench is a load generator for this machine. In the open loop each
// target is sent --rate requests a second on a fixed schedule (or a
// workload file's timestamps), the targets interleaved slot by slot, and
// latency is counted from the scheduled send; --concurrency runs a closed
// loop instead. The request shape options are loadgen.Config's. --trace
// replays a trace instead (runBenchTrace).
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
	fs.Func("prompt-bytes", "size of each user message in bytes, N or MIN-MAX (uniform), random words", func(v string) (err error) {
		cfg.PromptBytes, err = loadgen.ParseSizes(v)
		return err
	})
	fs.Func("shared-prefix", "K:L: open every request with one of K system prompts of L bytes, Zipf popularity", func(v string) (err error) {
		cfg.SharedPrefix, err = loadgen.ParseSharedPrefix(v)
		return err
	})
	fs.IntVar(&cfg.Conversations, "conversations", 0, "spread requests over N multi-turn conversations (history and X-Conversation-Id)")
	workload := fs.String("workload", "", "JSONL file of request bodies: chat, completions, Responses or Messages (optional \"timestamp\": seconds), sent at their timestamps, or at --rate when given")
	fs.StringVar(&cfg.APIKey, "api-key", "", "send Authorization: Bearer <key>")
	fs.IntVar(&cfg.Concurrency, "concurrency", 0, "closed loop: keep N requests in flight per target instead of sending at --rate")
	fs.Int64Var(&cfg.Seed, "seed", 1, "seed of the generated prompts and choices")
	jsonOut := fs.String("json", "", "also write the report as JSON to this file (- for stdout)")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	stageTable := fs.Bool("stages", false, "print the stage budget of the run: p50/p99 per stage beside the bus floor, read from the recorder at --stages-url (switchyard dev --stages)")
	stagesURL := fs.String("stages-url", "", "base `URL` serving /stages (default: the --target's scheme and host)")
	tf := addTraceFlags(fs)
	if _, err := parseArgs(fs, args); err != nil {
		return err
	}
	if err := tf.validate(); err != nil {
		return err
	}
	if *tf.trace != "" {
		if err := checkTraceFlags(fs, true); err != nil {
			return err
		}
		timeout := cfg.Timeout
		if !flagSet(fs, "timeout") {
			timeout = 5 * time.Minute // a long prompt on a loaded pool
		}
		return runBenchTrace(ctx, tf, *target, cfg.Model, cfg.APIKey, timeout, *quiet, stdout, stderr)
	}
	if *target != "" {
		cfg.Targets = append([]string{*target}, compare...)
	}
	if *workload != "" {
		if err := loadWorkload(fs, &cfg, *workload); err != nil {
			return usageError{err}
		}
	}
	if err := checked(cfg.Validate()); err != nil {
		return err
	}
	if err := checkTraceFlags(fs, false); err != nil {
		return err
	}
	if *names != "" {
		cfg.Names = strings.Split(*names, ",")
	}
	if !*quiet {
		cfg.Progress = stderr
	}
	stagesAt := ""
	if *stageTable {
		var err error
		if stagesAt, err = stagesBase(*stagesURL, cfg.Targets); err != nil {
			return usageError{err}
		}
		// The table covers this run only.
		if err := stages.Reset(ctx, stagesAt); err != nil {
			return fmt.Errorf("--stages: %w (is the stack recording? switchyard dev --stages)", err)
		}
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
	if stagesAt != "" {
		sum, serr := stages.Fetch(ctx, stagesAt)
		if serr != nil {
			return fmt.Errorf("--stages: %w", serr)
		}
		fmt.Fprintln(stdout)
		sum.WriteTable(stdout, "switchyard bench, "+time.Now().UTC().Format("2006-01-02 15:04 UTC"))
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

// stagesBase is where the stage table is served: --stages-url, or the
// scheme and host of the first target.
func stagesBase(flagURL string, targets []string) (string, error) {
	raw := flagURL
	if raw == "" {
		if len(targets) == 0 {
			return "", errors.New("--stages needs --target or --stages-url")
		}
		raw = targets[0]
	}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return "", fmt.Errorf("--stages-url %q: want scheme://host[:port]", raw)
	}
	return u.Scheme + "://" + u.Host, nil
}

// loadWorkload reads the workload file into cfg. Unless --rate is given,
// a file whose every line has a timestamp is replayed at those times; the
// file is sent once unless --duration or --requests is given.
func loadWorkload(fs *flag.FlagSet, cfg *loadgen.Config, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("--workload: %w", err)
	}
	defer f.Close()
	cfg.Workload, err = loadgen.ReadWorkload(f)
	if err != nil {
		return fmt.Errorf("--workload %s: %w", path, err)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	timed := true
	for _, e := range cfg.Workload {
		timed = timed && e.HasAt
	}
	if !set["rate"] && cfg.Concurrency == 0 {
		if !timed {
			return fmt.Errorf("--workload %s: not every line has a timestamp; give --rate", path)
		}
		cfg.Replay = true
		cfg.Duration, cfg.Requests = 0, 0
		return nil
	}
	if !set["duration"] && !set["requests"] {
		cfg.Duration, cfg.Requests = 0, len(cfg.Workload)
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
