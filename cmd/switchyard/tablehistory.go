package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/table"
)

// tableHistory prints the revisions the bucket keeps of key (history 16).
func tableHistory(ctx context.Context, bucket jetstream.KeyValue, key string, stdout io.Writer) error {
	hist, err := bucket.History(ctx, key)
	if err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	for _, e := range hist {
		valid := ""
		if e.Operation() == jetstream.KeyValuePut {
			if _, err := table.Decode(key, e.Value()); err != nil {
				valid = "  # INVALID: " + err.Error()
			}
		}
		fmt.Fprintf(stdout, "rev %-6d %s %-6s %s%s\n", e.Revision(), e.Created().Format(time.RFC3339), opName(e.Operation()), compactJSON(e.Value()), valid)
	}
	return nil
}

func opName(op jetstream.KeyValueOp) string {
	switch op {
	case jetstream.KeyValuePut:
		return "put"
	case jetstream.KeyValueDelete:
		return "delete"
	case jetstream.KeyValuePurge:
		return "purge"
	}
	return op.String()
}

// tableRollback writes the value key had at rev back as its newest value,
// compare-and-set against the revision in force, after validating it.
func tableRollback(ctx context.Context, bucket jetstream.KeyValue, key string, rev uint64, stdout, stderr io.Writer) error {
	old, err := bucket.GetRevision(ctx, key, rev)
	if err != nil {
		return fmt.Errorf("%s at revision %d: %w", key, rev, err)
	}
	if _, err := table.Decode(key, old.Value()); err != nil {
		fmt.Fprintf(stderr, "revision %d is not a valid value: %v\n", rev, err)
		return errCheckFailed
	}
	cur, err := bucket.Get(ctx, key)
	var newRev uint64
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		newRev, err = bucket.Create(ctx, key, old.Value())
	case err != nil:
		return err
	default:
		newRev, err = bucket.Update(ctx, key, old.Value(), cur.Revision())
	}
	if err != nil {
		return fmt.Errorf("%s changed while rolling back (%w); try again", key, err)
	}
	fmt.Fprintf(stdout, "%s rolled back to revision %d (now revision %d)\n", key, rev, newRev)
	return nil
}

// tableEdit opens the value in $EDITOR and stores the result only if it is
// valid and nobody changed the key meanwhile.
func tableEdit(ctx context.Context, bucket jetstream.KeyValue, key string, stdout, stderr io.Writer) error {
	var orig []byte
	var rev uint64
	e, err := bucket.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		orig = []byte("{}\n")
	case err != nil:
		return err
	default:
		rev = e.Revision()
		if v, derr := table.Decode(key, e.Value()); derr == nil {
			if pretty, perr := table.Encode(v.V); perr == nil {
				orig = append(pretty, '\n')
			}
		}
		if orig == nil {
			orig = e.Value()
		}
	}
	dir, err := os.MkdirTemp("", "switchyard-edit")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, key+".json")
	if err := os.WriteFile(path, orig, 0o600); err != nil {
		return err
	}
	editor := os.Getenv("EDITOR")
	if editor == "" {
		editor = "vi"
	}
	cmd := exec.CommandContext(ctx, "sh", "-c", editor+` "$1"`, "editor", path)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("editor: %w", err)
	}
	edited, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if bytes.Equal(bytes.TrimSpace(edited), bytes.TrimSpace(orig)) {
		fmt.Fprintf(stdout, "%s unchanged\n", key)
		return nil
	}
	if _, err := table.Decode(key, edited); err != nil {
		fmt.Fprintf(stderr, "refused, the edited value is invalid: %v\n", err)
		return errCheckFailed
	}
	edited = compactJSON(edited)
	var newRev uint64
	if rev == 0 {
		newRev, err = bucket.Create(ctx, key, edited)
	} else {
		newRev, err = bucket.Update(ctx, key, edited, rev)
	}
	if err != nil {
		return fmt.Errorf("%s changed while you edited it (%w); nothing written", key, err)
	}
	fmt.Fprintf(stdout, "%s stored at revision %d\n", key, newRev)
	return nil
}

// compactJSON stores and prints values on one line, as `nats kv` shows them.
func compactJSON(b []byte) []byte {
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return bytes.TrimSpace(b)
	}
	return out.Bytes()
}
