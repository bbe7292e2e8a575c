package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard-llm/switchyard/internal/check"
	"github.com/switchyard-llm/switchyard/lab"
)

// runLab runs routing experiments in virtual time and writes their report.
func runLab(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("lab", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "a smaller, faster run")
	seed := fs.Uint64("seed", 1, "random seed: the same seed gives the same numbers")
	out := fs.String("out", "lab-out", "directory for report.md, charts and CSV files")
	workers := fs.Int("workers", 0, "simulations run at once (0: one per CPU; at most 1024)")
	rf := replayFlags{
		trace:       fs.String("trace", "", "replay: the trace file to replay (required)"),
		format:      fs.String("format", lab.FormatMooncake, "replay: the trace's format, "+strings.Join(lab.TraceFormats(), " or ")),
		blockTokens: fs.Int("block-tokens", 512, "replay: tokens of one of the trace's hash ids"),
		replicas:    fs.Int("replicas", 8, "replay: replicas of the lab's profile"),
		speedups:    fs.String("speedups", "", "replay: time-compression factors, comma-separated, one run each (default: a grid from half the pool's capacity to one step past it)"),
		limit:       fs.Int("limit", 0, "replay: the trace's first N requests (0: all; --quick: 3000)"),
		profile:     fs.String("profile", lab.ReplayProfileLab, "replay: the replicas, "+strings.Join(lab.ReplayProfiles(), " or ")+" (dev: the pool switchyard dev serves "+lab.DevReplayModel+" with, under the dev table)"),
		speed:       fs.Float64("speed", 1, "replay --profile dev: the dev stack's --speed"),
		arms:        fs.String("arms", "", "replay: the arms to run, comma-separated (default: all, "+strings.Join(lab.ReplayArms(), ", ")+")"),
	}
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := checked(check.Range("workers", *workers, 0, 1024), check.Range("block-tokens", *rf.blockTokens, 1, 1<<20),
		check.Range("replicas", *rf.replicas, 1, 1024), check.Range("limit", *rf.limit, 0, 1<<30),
		check.Range("speed", *rf.speed, 1e-6, 1e6)); err != nil {
		return err
	}
	if len(pos) == 1 && pos[0] == "replay" && *rf.trace != "" {
		return runReplay(ctx, fs, args, rf, *quick, *seed, *out, *workers, stdout, stderr)
	}
	if *rf.trace != "" {
		return usagef("--trace is for lab replay")
	}
	if len(pos) == 1 && pos[0] != "replay" && slices.ContainsFunc(replayOnly, func(n string) bool { return flagSet(fs, n) }) {
		return usagef("--%s are for lab replay --trace", strings.Join(replayOnly, ", --"))
	}
	names := make([]string, 0, len(lab.Experiments()))
	for _, e := range lab.Experiments() {
		names = append(names, e.Name)
	}
	if len(pos) != 1 {
		return usagef("want one experiment: %s|all", strings.Join(names, "|"))
	}
	var run []lab.Experiment
	if pos[0] == "all" {
		run = lab.Experiments()
	} else if e, ok := lab.Lookup(pos[0]); ok {
		run = []lab.Experiment{e}
	} else {
		return usagef("unknown experiment %q: want %s|all", pos[0], strings.Join(names, "|"))
	}
	o := lab.Options{Seed: *seed, Workers: *workers}
	if *quick {
		o.Scale = lab.Quick
	}
	start := time.Now()
	var secs []*lab.Section
	for _, e := range run {
		if err := ctx.Err(); err != nil {
			return err
		}
		t := time.Now()
		secs = append(secs, e.Run(o))
		fmt.Fprintf(stderr, "lab: %-10s %6.1fs\n", e.Name, time.Since(t).Seconds())
	}
	cmd := "switchyard lab " + strings.Join(args, " ")
	meta := lab.Meta{Command: strings.TrimSpace(cmd), Scale: o.Scale, Seed: *seed, Elapsed: time.Since(start)}
	if err := lab.WriteReport(*out, meta, secs); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "lab: report in %s (%.1fs)\n", filepath.Join(*out, "report.md"), time.Since(start).Seconds())
	return nil
}

// replayFlags are lab replay's flags.
type replayFlags struct {
	trace, format, speedups, profile, arms *string
	blockTokens, replicas, limit           *int
	speed                                  *float64
}

// replayOnly are the flags only lab replay --trace takes.
var replayOnly = []string{"format", "block-tokens", "replicas", "speedups", "limit", "profile", "speed", "arms"}

// runReplay replays a trace through every arm and writes its report.
func runReplay(ctx context.Context, fs *flag.FlagSet, args []string, rf replayFlags, quick bool, seed uint64, out string, workers int,
	stdout, stderr io.Writer) error {
	if !slices.Contains(lab.TraceFormats(), *rf.format) {
		return usagef("--format %q: want one of %s", *rf.format, strings.Join(lab.TraceFormats(), ", "))
	}
	var speedups []float64
	if *rf.speedups != "" {
		for _, f := range strings.Split(*rf.speedups, ",") {
			v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
			if err != nil || !(v > 0) || math.IsInf(v, 0) {
				return usagef("--speedups: %q is not a positive number", f)
			}
			speedups = append(speedups, v)
		}
	}
	if !slices.Contains(lab.ReplayProfiles(), *rf.profile) {
		return usagef("--profile %q: want one of %s", *rf.profile, strings.Join(lab.ReplayProfiles(), ", "))
	}
	if *rf.profile == lab.ReplayProfileDev && flagSet(fs, "replicas") {
		return usagef("--replicas: the dev profile's replicas are the dev stack's")
	}
	if *rf.profile != lab.ReplayProfileDev && flagSet(fs, "speed") {
		return usagef("--speed is the dev stack's: it goes with --profile dev")
	}
	var arms []string
	if *rf.arms != "" {
		for _, a := range strings.Split(*rf.arms, ",") {
			if a = strings.TrimSpace(a); !slices.Contains(lab.ReplayArms(), a) {
				return usagef("--arms: unknown arm %q (want some of %s)", a, strings.Join(lab.ReplayArms(), ", "))
			}
			arms = append(arms, strings.TrimSpace(a))
		}
	}
	f, err := os.Open(*rf.trace)
	if err != nil {
		return err
	}
	defer f.Close()
	o := lab.Options{Seed: seed, Workers: workers}
	if quick {
		o.Scale = lab.Quick
	}
	start := time.Now()
	cfg := lab.ReplayConfig{Name: *rf.trace, R: f, Format: *rf.format, BlockTokens: *rf.blockTokens,
		Replicas: *rf.replicas, Speedups: speedups, Limit: *rf.limit, Profile: *rf.profile, Speed: *rf.speed, Arms: arms}
	tr, err := lab.LoadTrace(cfg, o)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	sec := lab.Replay(o, tr, cfg).Section()
	fmt.Fprintf(stderr, "lab: %-10s %6.1fs\n", "replay", time.Since(start).Seconds())
	cmd := "switchyard lab " + strings.Join(args, " ")
	meta := lab.Meta{Command: strings.TrimSpace(cmd), Scale: o.Scale, Seed: seed, Elapsed: time.Since(start)}
	if err := lab.WriteReport(out, meta, []*lab.Section{sec}); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "lab: report in %s (%.1fs)\n", filepath.Join(out, "report.md"), time.Since(start).Seconds())
	return nil
}

// flagSet reports whether the flag name was given.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
