// Command switchyard runs every part of Switchyard: `switchyard dev` runs
// them all at once on an embedded NATS; the other subcommands run one part
// against an existing NATS, or operate the routing table.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/switchyard-llm/switchyard/internal/buildinfo"
	"github.com/switchyard-llm/switchyard/internal/check"
	"github.com/switchyard-llm/switchyard/internal/gctune"
)

// exitUsage is the exit code for bad usage; a failed check or request is 1.
const exitUsage = 2

type command struct {
	name  string
	usage string
	run   func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"dev", "run the whole stack on an embedded NATS with simulated engines", runDev},
		{"broker", "run a broker (routing decisions) against NATS", runBroker},
		{"gateway", "run the OpenAI-compatible HTTP gateway against NATS", runGateway},
		{"adapter", "run a replica adapter beside an engine", runAdapter},
		{"loader", "load cold models on request and unload idle ones", runLoader},
		{"batcher", "run batch lines (the Batch API) through the brokers in the pool's spare capacity", runBatcher},
		{"batch", "list, show and cancel every tenant's batches (operators)", runBatch},
		{"engine-sim", "run a simulated vLLM-compatible engine", runEngineSim},
		{"table", "read and edit the routing table", runTable},
		{"explain", "explain the decision for a hypothetical request", runExplain},
		{"auth", "generate NATS keys and creds, mint and revoke creds (docs/security.md)", runAuth},
		{"key", "add, list and revoke API keys and set their budgets (a key is printed once and stored hashed)", runKey},
		{"usage", "sum the ledger's requests, tokens and cost by tenant, key, model or day (operators)", runUsage},
		{"bench", "load test of OpenAI endpoints on this machine (open or closed loop, your workload shapes)", runBench},
		{"decisions", "follow the brokers' explained decisions live", runDecisions},
		{"lab", "run routing experiments in virtual time and write a report", runLab},
		{"version", "print the version, commit and Go version of this binary", runVersion},
	}
}

func main() {
	stopGC := gctune.Start()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	stopGC()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return exitUsage
		}
		return 0
	}
	if args[0] == "--version" || args[0] == "-version" {
		args = []string{"version"}
	}
	for _, c := range commands() {
		if c.name == args[0] {
			err := c.run(ctx, args[1:], stdout, stderr)
			var ue usageError
			var he helpError
			switch {
			case err == nil:
				return 0
			case errors.As(err, &he):
				printHelp(stdout, c, he.fs)
				return 0
			case errors.Is(err, flag.ErrHelp):
				return 0
			case errors.As(err, &ue):
				fmt.Fprintf(stderr, "switchyard %s: %v\n", c.name, err)
				return exitUsage
			default:
				fmt.Fprintf(stderr, "switchyard %s: %v\n", c.name, err)
				return 1
			}
		}
	}
	fmt.Fprintf(stderr, "switchyard: unknown command %q\n", args[0])
	usage(stderr)
	return exitUsage
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: switchyard <command> [flags] [args]")
	fmt.Fprintln(w)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-11s %s\n", c.name, c.usage)
	}
}

// synopsis is the usage line of a command: "switchyard NAME [flags]" but
// for the commands that take arguments too.
func synopsis(name string) string {
	switch name {
	case "table":
		return strings.TrimPrefix(tableUsage, "usage: ")
	case "key":
		return strings.TrimPrefix(keyUsage, "usage: ") + " [flags]"
	case "batch":
		return strings.TrimPrefix(batchUsage, "usage: ") + " [flags]"
	case "auth":
		return strings.TrimPrefix(authUsage, "usage: ")
	case "lab":
		return "switchyard lab [flags] EXPERIMENT|all (replay: [--trace FILE])"
	}
	return "switchyard " + name + " [flags]"
}

// printHelp is `switchyard NAME -h`: the synopsis, what the command does and
// every flag with its default.
func printHelp(w io.Writer, c command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: %s\n\n%s\n\nflags:\n", synopsis(c.name), c.usage)
	fs.SetOutput(w)
	fs.PrintDefaults()
}

// helpError is -h or --help: run prints the command's help, exit 0.
type helpError struct{ fs *flag.FlagSet }

func (helpError) Error() string { return flag.ErrHelp.Error() }
func (helpError) Unwrap() error { return flag.ErrHelp }

// usageError marks bad usage (exit 2).
type usageError struct{ error }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// checked is bad usage when any of errs (each a Config's Validate, or a
// single flag's check) is not nil. Every command calls it after parsing its
// flags and before it connects to or starts anything.
func checked(errs ...error) error {
	if err := errors.Join(errs...); err != nil {
		return usageError{err}
	}
	return nil
}

// parseArgs parses flags that may come before or after positional
// arguments, and returns the positional ones.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	fs.SetOutput(io.Discard)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, helpError{fs}
			}
			return nil, usageError{err}
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, notNegative(fs)
		}
		if rest[0] == "--" {
			return append(pos, rest[1:]...), notNegative(fs)
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// checkLogLevel is the check of every --log-level flag.
func checkLogLevel(level string) error {
	var l slog.Level
	return check.Wrap("log-level", level, l.UnmarshalText([]byte(level)))
}

// notNegative refuses a negative value for any numeric flag given.
func notNegative(fs *flag.FlagSet) error {
	var errs []error
	fs.Visit(func(f *flag.Flag) {
		if g, ok := f.Value.(flag.Getter); ok {
			errs = append(errs, check.NotNegative(f.Name, g.Get()))
		}
	})
	return checked(errs...)
}

func newLogger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}

func runVersion(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print version, revision and Go version as JSON, for scripts")
	if pos, err := parseArgs(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return usagef("usage: switchyard version [--json]")
	}
	bi := buildinfo.Read()
	if *asJSON {
		return json.NewEncoder(stdout).Encode(bi)
	}
	fmt.Fprintln(stdout, bi)
	return nil
}
