package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/budget"
	"github.com/switchyard-llm/switchyard/internal/check"
	"github.com/switchyard-llm/switchyard/subjects"
)

// usageGroups are what `switchyard usage --by` may group the ledger by.
var usageGroups = []string{"tenant", "key", "model", "day"}

// runUsage sums the LEDGER stream's records (operators may read it;
// tenants may not), grouped as --by says.
func runUsage(ctx context.Context, args []string, stdout, _ io.Writer) error {
	fs := flag.NewFlagSet("usage", flag.ContinueOnError)
	var nf natsFlags
	nf.register(fs)
	tenant := fs.String("tenant", "", "only this tenant's requests")
	key := fs.String("key", "", "only the requests of this API key (its id, as switchyard key list shows)")
	model := fs.String("model", "", "only the requests of this model")
	since := fs.String("since", "", "only requests from this time on (RFC 3339, or a date: 2026-12-01)")
	until := fs.String("until", "", "only requests before this time (RFC 3339, or a date)")
	by := fs.String("by", "tenant", "group by tenant, key, model or day (comma-separated for several)")
	asCSV := fs.Bool("csv", false, "print CSV")
	asJSON := fs.Bool("json", false, `print {"rows": [...], "total_cost": ...}`)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	var errs []error
	if len(pos) > 0 {
		errs = append(errs, usagef("usage takes no arguments, only flags"))
	}
	if *tenant != "" {
		errs = append(errs, check.Wrap("tenant", *tenant, subjects.ValidToken(*tenant)))
	}
	if *key != "" {
		errs = append(errs, validKeyID(*key))
	}
	from, ferr := parseWhen("since", *since)
	to, terr := parseWhen("until", *until)
	errs = append(errs, ferr, terr, nf.validate())
	groups := strings.Split(*by, ",")
	for _, g := range groups {
		if !slices.Contains(usageGroups, g) {
			errs = append(errs, usagef("--by %q: want tenant, key, model or day", g))
		}
	}
	if *asCSV && *asJSON {
		errs = append(errs, usagef("--csv and --json: choose one"))
	}
	if err := checked(errs...); err != nil {
		return err
	}
	nc, err := nf.connectOnce(ctx, "switchyard-usage")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	rows := map[string]*usageRow{}
	var total budget.Micro
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	err = budget.ReadLedger(rctx, js, nf.prefix, *tenant, from, func(r *subjects.LedgerRecord) error {
		at := time.UnixMilli(r.Time).UTC()
		if (!to.IsZero() && !at.Before(to)) || (*model != "" && r.Model != *model) || (*key != "" && !strings.HasPrefix(r.Key, *key)) {
			return nil
		}
		vals := map[string]string{"tenant": r.Tenant, "key": r.Key, "model": r.Model, "day": at.Format(time.DateOnly)}
		var id strings.Builder
		for _, g := range groups {
			id.WriteString(vals[g] + "\x00")
		}
		row := rows[id.String()]
		if row == nil {
			row = &usageRow{groups: map[string]string{}}
			for _, g := range groups {
				row.groups[g] = vals[g]
			}
			rows[id.String()] = row
		}
		if !r.Resumed {
			row.Requests++ // a continuation is the rest of a request counted already
		}
		row.Prompt += r.PromptTokens
		row.Cached += r.CachedTokens
		row.Output += r.OutputTokens
		row.cost += budget.Micro(r.CostMicro)
		total += budget.Micro(r.CostMicro)
		return nil
	})
	if err != nil {
		return fmt.Errorf("reading the ledger (stream %s): %w", subjects.LedgerStream, err)
	}
	sorted := slices.SortedFunc(maps.Values(rows), func(a, b *usageRow) int {
		for _, g := range groups {
			if c := strings.Compare(a.groups[g], b.groups[g]); c != 0 {
				return c
			}
		}
		return 0
	})
	switch {
	case *asJSON:
		out := struct {
			Rows      []map[string]any `json:"rows"`
			TotalCost float64          `json:"total_cost"`
		}{Rows: []map[string]any{}, TotalCost: total.Amount()}
		for _, r := range sorted {
			m := map[string]any{"requests": r.Requests, "prompt_tokens": r.Prompt, "cached_tokens": r.Cached,
				"output_tokens": r.Output, "cost": r.cost.Amount()}
			for g, v := range r.groups {
				m[g] = v
			}
			out.Rows = append(out.Rows, m)
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	case *asCSV:
		w := csv.NewWriter(stdout)
		_ = w.Write(append(slices.Clone(groups), "requests", "prompt_tokens", "cached_tokens", "output_tokens", "cost"))
		for _, r := range sorted {
			rec := make([]string, 0, len(groups)+5)
			for _, g := range groups {
				rec = append(rec, r.groups[g])
			}
			_ = w.Write(append(rec, strconv.Itoa(r.Requests), strconv.Itoa(r.Prompt), strconv.Itoa(r.Cached), strconv.Itoa(r.Output), r.cost.String()))
		}
		w.Flush()
		return w.Error()
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, strings.ToUpper(strings.Join(groups, "\t"))+"\tREQUESTS\tPROMPT\tCACHED\tOUTPUT\tCOST")
	for _, r := range sorted {
		for _, g := range groups {
			fmt.Fprintf(tw, "%s\t", orDash(r.groups[g]))
		}
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%s\n", r.Requests, r.Prompt, r.Cached, r.Output, r.cost)
	}
	fmt.Fprintf(tw, "TOTAL%s\t\t\t\t\t%s\n", strings.Repeat("\t", len(groups)-1), total)
	return tw.Flush()
}

type usageRow struct {
	groups                           map[string]string
	Requests, Prompt, Cached, Output int
	cost                             budget.Micro
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// parseWhen reads --since or --until: RFC 3339, or a date (midnight UTC).
func parseWhen(flag, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.DateOnly, v); err == nil {
		return t, nil
	}
	return time.Time{}, usagef("--%s %q: want RFC 3339 (2026-12-01T00:00:00Z) or a date (2026-12-01)", flag, v)
}
