package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/batch"
	"github.com/switchyard-llm/switchyard/internal/check"
	"github.com/switchyard-llm/switchyard/subjects"
)

const batchUsage = "usage: switchyard batch list [--tenant T] | get ID | cancel ID"

// runBatch shows and cancels batches for operators: every tenant's, from
// the llm-batches bucket.
func runBatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("batch", flag.ContinueOnError)
	var nf natsFlags
	nf.register(fs)
	tenant := fs.String("tenant", "", "list only this tenant's batches")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	var tenantErr, argErr error
	if *tenant != "" {
		tenantErr = check.Wrap("tenant", *tenant, subjects.ValidToken(*tenant))
	}
	switch {
	case len(pos) == 1 && pos[0] == "list":
	case len(pos) == 2 && (pos[0] == "get" || pos[0] == "cancel"):
		if !batch.ValidID("batch_", pos[1]) {
			argErr = usagef("%q is not a batch id (batch_…)", pos[1])
		}
	default:
		argErr = usagef(batchUsage)
	}
	if err := checked(nf.validate(), tenantErr, argErr); err != nil {
		return err
	}
	nc, err := nf.connectOnce(ctx, "switchyard-batch")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, err := batch.OpenStore(cctx, js, 1)
	if err != nil {
		return err
	}
	recs, err := st.Batches(cctx, *tenant)
	if err != nil {
		return err
	}
	if pos[0] == "list" {
		return listBatches(recs, stdout)
	}
	var rec *batch.Record
	for _, r := range recs {
		if r.ID == pos[1] {
			rec = r
		}
	}
	if rec == nil {
		return fmt.Errorf("no batch %s", pos[1])
	}
	if pos[0] == "cancel" {
		var apiErr *subjects.APIError
		if rec, apiErr = st.Cancel(cctx, rec.Tenant, rec.ID); apiErr != nil {
			return errors.New(apiErr.Message)
		}
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(rec)
}

func listBatches(recs []*batch.Record, stdout io.Writer) error {
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BATCH\tTENANT\tSTATUS\tDONE\tFAILED\tTOTAL\tENDPOINT\tCREATED")
	for _, r := range recs {
		c := r.RequestCounts
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", r.ID, r.Tenant, r.Status, c.Completed, c.Failed, c.Total,
			r.Endpoint, time.Unix(r.CreatedAt, 0).UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}
