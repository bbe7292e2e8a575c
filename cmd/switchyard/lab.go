package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"path/filepath"
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
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := checked(check.Range("workers", *workers, 0, 1024)); err != nil {
		return err
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
