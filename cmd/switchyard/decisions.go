package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/subjects"
)

// decisionFilter keeps the decisions a `switchyard decisions` user asked for.
// Empty fields match everything.
type decisionFilter struct {
	pool, model, replica string
}

// match reports whether d passes the filter. --model matches the requested
// name (an alias) as well as the resolved model id, with or without a
// LoRA adapter.
func (f decisionFilter) match(d *subjects.Decision) bool {
	if f.pool != "" && d.Pool != f.pool {
		return false
	}
	if f.replica != "" && d.Replica != f.replica {
		return false
	}
	if f.model != "" {
		base, _, _ := strings.Cut(d.Requested, ":")
		if f.model != d.Requested && f.model != base && f.model != d.Model {
			return false
		}
	}
	return true
}

// runDecisions follows the brokers' explained decisions live, one line each.
func runDecisions(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("decisions", flag.ContinueOnError)
	var nf natsFlags
	nf.register(fs)
	var f decisionFilter
	fs.StringVar(&f.pool, "pool", "", "only decisions for this pool")
	fs.StringVar(&f.model, "model", "", "only decisions for this alias or model id")
	fs.StringVar(&f.replica, "replica", "", "only decisions that picked this replica")
	asJSON := fs.Bool("json", false, "print each decision as JSON")
	if pos, err := parseArgs(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return usagef("unexpected argument %q", pos[0])
	}
	if err := checked(nf.validate()); err != nil {
		return err
	}
	subj := subjects.New(nf.prefix)
	subject := subj.DecisionAll()
	if f.pool != "" {
		// Decisions are published per pool: let the server do the filtering.
		if err := subjects.ValidToken(f.pool); err != nil {
			return usagef("--pool: %v", err)
		}
		subject = subj.Decision(f.pool)
	}
	nc, err := nf.connect(ctx, "switchyard-decisions", nil)
	if err != nil {
		return err
	}
	defer nc.Close()
	msgs := make(chan *nats.Msg, 1024)
	sub, err := nc.ChanSubscribe(subject, msgs)
	if err != nil {
		return err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.FlushWithContext(withTimeout(ctx, 5*time.Second)); err != nil {
		return fmt.Errorf("subscribe %s: %w", subject, err)
	}
	fmt.Fprintf(stderr, "following %s (Ctrl-C stops)\n", subject)
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-msgs:
			var d subjects.Decision
			if err := json.Unmarshal(m.Data, &d); err != nil {
				fmt.Fprintf(stderr, "%s: undecodable decision: %v\n", m.Subject, err)
				continue
			}
			if !f.match(&d) {
				continue
			}
			if *asJSON {
				fmt.Fprintf(stdout, "%s\n", m.Data)
			} else {
				fmt.Fprintln(stdout, formatDecision(&d, time.Local))
			}
		}
	}
}

// formatDecision renders one decision on one line: time, tenant, requested →
// model version, pool, replica, reason and the runner-up with why it lost;
// for a rejection, its status and code.
//
//	14:03:07.412 default  chat-large → llama-3-70b-instruct v1.5.0  pool general  → l70-gen-1  power-of-two  runner-up l70-gen-0 (0.412 vs 0.118): higher load_score
//	14:03:08.020 trial    chat-large  rejected 429 rate_limit_exceeded: rpm quota of 5 reached
//
// A continuation says which replica's answer it resumes, and the tokens it
// carried over.
func formatDecision(d *subjects.Decision, loc *time.Location) string {
	var b strings.Builder
	b.WriteString(time.UnixMilli(d.DecidedUnixMil).In(loc).Format("15:04:05.000"))
	fmt.Fprintf(&b, " %-8s %s", cmp.Or(d.Tenant, "-"), cmp.Or(d.Requested, "?"))
	if d.Model != "" {
		fmt.Fprintf(&b, " → %s", d.Model)
		if d.Version != "" {
			b.WriteString(" " + d.Version)
		}
		if d.Lora != "" {
			b.WriteString(" +lora " + d.Lora)
		}
	}
	if d.Pool != "" {
		b.WriteString("  pool " + d.Pool)
	}
	if d.Code != "" {
		fmt.Fprintf(&b, "  rejected %d %s", d.Status, d.Code)
		if d.Message != "" {
			b.WriteString(": " + d.Message)
		}
		return b.String()
	}
	fmt.Fprintf(&b, "  → %s  %s", cmp.Or(d.Replica, "?"), cmp.Or(d.Reason, "?"))
	if d.PrefillReplica != "" {
		fmt.Fprintf(&b, "  prefill on %s (%d uncached tokens)", d.PrefillReplica, d.UncachedTokens)
	} else if d.Split != "" {
		fmt.Fprintf(&b, "  %s (%d uncached tokens)", d.Split, d.UncachedTokens)
	}
	if d.ResumeFrom != "" {
		fmt.Fprintf(&b, "  resumed from %s, %d tokens carried", d.ResumeFrom, d.ResumeTokens)
	}
	if len(d.Alternatives) == 0 {
		b.WriteString("  no runner-up")
		return b.String()
	}
	a := d.Alternatives[0]
	fmt.Fprintf(&b, "  runner-up %s (%.3f vs %.3f): %s", a.Replica, a.Score, d.Score, a.Why)
	return b.String()
}
