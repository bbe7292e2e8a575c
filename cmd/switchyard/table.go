package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/budget"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
	"github.com/switchyard-llm/switchyard/table/kv"
)

const tableUsage = "usage: switchyard table init [--replicas N] [--ledger-max-age 400d] | copy REGION [--replicas N] | get KEY | put KEY [FILE|-] | edit KEY | watch [PREFIX] | import FILE [--replicas N] | export | validate FILE | history KEY | rollback KEY REV"

// errCheckFailed is a failed check (exit 1) whose details were printed.
var errCheckFailed = errors.New("check failed")

func runTable(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("table", flag.ContinueOnError)
	var nf natsFlags
	nf.register(fs)
	replicas := fs.Int("replicas", 0, "replicas of the bucket when init, import or copy creates it (1-5; default 1)")
	ledgerAge := fs.String("ledger-max-age", "", "how long the LEDGER stream keeps a record, in days (400d) or as a duration (init; default 400d)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := checked(nf.validate()); err != nil {
		return err
	}
	if *replicas < 0 || *replicas > 5 {
		return usagef("--replicas %d: want 1 to 5 (JetStream's limit)", *replicas)
	}
	if len(pos) == 0 {
		return usagef("%s", tableUsage)
	}
	verb, rest := pos[0], pos[1:]
	want := map[string][2]int{"init": {0, 0}, "copy": {1, 1}, "get": {1, 1}, "put": {1, 2}, "watch": {0, 1}, "import": {1, 1}, "export": {0, 0}, "validate": {1, 1},
		"edit": {1, 1}, "history": {1, 1}, "rollback": {2, 2}}
	n, ok := want[verb]
	if !ok || len(rest) < n[0] || len(rest) > n[1] {
		return usagef("%s", tableUsage)
	}
	if *replicas != 0 && verb != "init" && verb != "import" && verb != "copy" {
		return usagef("--replicas applies to init, import and copy only")
	}
	maxAge := budget.DefaultLedgerMaxAge
	if *ledgerAge != "" {
		if verb != "init" {
			return usagef("--ledger-max-age applies to init only")
		}
		if maxAge, err = budget.ParseAge(*ledgerAge); err != nil {
			return usagef("--ledger-max-age %v", err)
		}
	}
	if verb == "validate" {
		return validateFile(rest[0], stdout, stderr)
	}
	if verb == "init" {
		return tableInit(ctx, &nf, max(*replicas, 1), maxAge, stdout)
	}
	if verb == "copy" {
		return tableCopy(ctx, &nf, rest[0], max(*replicas, 1), stdout)
	}
	var flat map[string]json.RawMessage
	if verb == "import" { // a bad file is refused before anything connects
		b, err := readInput(rest[0])
		if err != nil {
			return err
		}
		var errs []error
		if flat, errs = table.ParseFlat(b); len(errs) > 0 {
			for _, e := range errs {
				fmt.Fprintln(stderr, e)
			}
			return errCheckFailed
		}
	}
	var bucket jetstream.KeyValue
	var js jetstream.JetStream
	var closeConn func()
	if verb == "import" {
		// A first import on a fresh server creates the bucket, so that
		// bootstrapping needs no other step.
		bucket, js, closeConn, _, err = nf.ensureBucket(ctx, "switchyard-table", max(*replicas, 1))
	} else {
		bucket, js, closeConn, err = nf.openBucket(ctx, "switchyard-table")
	}
	if err != nil {
		return err
	}
	defer closeConn()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	switch verb {
	case "get":
		e, err := bucket.Get(cctx, rest[0])
		if err != nil {
			return fmt.Errorf("%s: %w", rest[0], err)
		}
		fmt.Fprintf(stdout, "%s\n", e.Value())
	case "put":
		src := "-"
		if len(rest) == 2 {
			src = rest[1]
		}
		b, err := readInput(src)
		if err != nil {
			return err
		}
		if _, err := table.Decode(rest[0], b); err != nil {
			fmt.Fprintln(stderr, err)
			return errCheckFailed
		}
		rev, err := bucket.Put(cctx, rest[0], compactJSON(b))
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s stored at revision %d\n", rest[0], rev)
	case "import":
		rep, err := kv.Import(cctx, bucket, flat, kv.Atomic(js))
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, rep)
	case "export":
		flat, err := kv.Export(cctx, bucket)
		if err != nil {
			return err
		}
		return writeFlat(stdout, flat)
	case "watch":
		cancel()
		return watchTable(ctx, bucket, rest, stdout)
	case "history":
		return tableHistory(cctx, bucket, rest[0], stdout)
	case "rollback":
		rev, err := strconv.ParseUint(rest[1], 10, 64)
		if err != nil {
			return usagef("REV must be a revision number")
		}
		return tableRollback(cctx, bucket, rest[0], rev, stdout, stderr)
	case "edit":
		cancel()
		return tableEdit(ctx, bucket, rest[0], stdout, stderr)
	}
	return nil
}

// tableCopy makes region's copy of the routing table (kv.EnsureCopy): a
// mirror of the bucket placed in the NATS cluster named region, which the
// region's brokers and gateways (--region) read. It never changes an
// existing copy.
func tableCopy(ctx context.Context, nf *natsFlags, region string, replicas int, stdout io.Writer) error {
	if err := subjects.ValidToken(region); err != nil {
		return usagef("REGION %q: %v", region, err)
	}
	_, js, closeConn, err := nf.openBucket(ctx, "switchyard-table")
	if err != nil {
		return err
	}
	defer closeConn()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := kv.EnsureCopy(cctx, js, nf.bucket, region, replicas)
	if err != nil {
		return fmt.Errorf("region %s's copy of %s: %w", region, nf.bucket, err)
	}
	info := s.CachedInfo()
	cluster := ""
	if info.Cluster != nil {
		cluster = info.Cluster.Name
	}
	fmt.Fprintf(stdout, "%s: region %s's copy of %s (in cluster %s, %d replicas, %d messages)\n",
		kv.CopyName(nf.bucket, region), region, nf.bucket, cluster, info.Config.Replicas, info.State.Msgs)
	return nil
}

// tableInit creates the bucket with kv.History revisions per key and the
// given replicas, and says what it found when the bucket already exists: it
// never changes an existing bucket.
func tableInit(ctx context.Context, nf *natsFlags, replicas int, ledgerAge time.Duration, stdout io.Writer) error {
	bucket, js, closeConn, created, err := nf.ensureBucket(ctx, "switchyard-table", replicas)
	if err != nil {
		return err
	}
	defer closeConn()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := bucket.Status(cctx)
	if err != nil {
		return err
	}
	have := 0
	if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok {
		have = bs.StreamInfo().Config.Replicas
	}
	verb := "exists"
	if created {
		verb = "created"
	}
	fmt.Fprintf(stdout, "bucket %s %s: %d replicas, %d revisions per key, %d keys\n", st.Bucket(), verb, have, st.History(), st.Values())
	// The budgets' spend and the ledger, as many times replicated as the
	// table.
	did, err := budget.Ensure(cctx, js, nf.prefix, max(have, 1), ledgerAge)
	for _, line := range did {
		fmt.Fprintln(stdout, line)
	}
	return err
}

func readInput(src string) ([]byte, error) {
	if src == "-" {
		return io.ReadAll(os.Stdin)
	}
	return os.ReadFile(src)
}

func validateFile(path string, stdout, stderr io.Writer) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	flat, errs := table.ParseFlat(b)
	for _, e := range errs {
		fmt.Fprintln(stderr, e)
	}
	if len(errs) > 0 {
		return errCheckFailed
	}
	fmt.Fprintf(stdout, "%s: %d keys, all valid\n", path, len(flat))
	return nil
}

// writeFlat prints a flat key → value object with sorted keys.
func writeFlat(w io.Writer, flat map[string]json.RawMessage) error {
	fmt.Fprintln(w, "{")
	keys := slices.Sorted(maps.Keys(flat))
	for i, k := range keys {
		kb, _ := json.Marshal(k)
		sep := ","
		if i == len(keys)-1 {
			sep = ""
		}
		fmt.Fprintf(w, "  %s: %s%s\n", kb, compactJSON(flat[k]), sep)
	}
	fmt.Fprintln(w, "}")
	return nil
}

func watchTable(ctx context.Context, bucket jetstream.KeyValue, rest []string, stdout io.Writer) error {
	// A prefix names a key and everything below it: "aliases" watches
	// aliases.*, "policy" the policy key.
	patterns := []string{">"}
	if len(rest) == 1 && rest[0] != "" {
		p := strings.TrimSuffix(rest[0], ".")
		patterns = []string{p, p + ".>"}
	}
	w, err := bucket.WatchFiltered(ctx, patterns)
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return nil
			}
			if e == nil {
				fmt.Fprintln(stdout, "# caught up")
				continue
			}
			status := ""
			if _, err := table.Decode(e.Key(), e.Value()); err != nil && e.Operation() == jetstream.KeyValuePut {
				status = "  # INVALID: " + err.Error()
			}
			fmt.Fprintf(stdout, "%s rev=%d %s %s%s\n", e.Created().Format(time.RFC3339), e.Revision(), e.Operation(), e.Key(), status)
			if e.Operation() == jetstream.KeyValuePut {
				fmt.Fprintf(stdout, "  %s\n", e.Value())
			}
		}
	}
}
