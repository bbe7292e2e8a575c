package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/switchyard-llm/switchyard/internal/check"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// runKey adds an API key: it prints the key once and stores only its hash.
func runKey(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("key", flag.ContinueOnError)
	var nf natsFlags
	nf.register(fs)
	tenant := fs.String("tenant", "", "tenant the key speaks for")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if err := checked(nf.validate(), check.Wrap("tenant", *tenant, subjects.ValidToken(*tenant))); err != nil {
		return err
	}
	if len(pos) != 1 || pos[0] != "add" {
		return usagef("usage: switchyard key add --tenant T")
	}
	key, hash := newAPIKey()
	bucket, _, closeConn, err := nf.openBucket(ctx, "switchyard-key")
	if err != nil {
		return err
	}
	defer closeConn()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	value := []byte(fmt.Sprintf(`{"tenant":%q}`, *tenant))
	k := table.PrefixKeys + hash
	if _, err := table.Decode(k, value); err != nil {
		return err
	}
	if _, err := bucket.Create(cctx, k, value); err != nil {
		return err
	}
	if _, err := bucket.Get(cctx, table.PrefixTenants+*tenant); err != nil {
		fmt.Fprintf(stderr, "note: tenants.%s is not in the table yet; the key works, with default settings\n", *tenant)
	}
	fmt.Fprintln(stdout, key)
	return nil
}

// newAPIKey returns a fresh key and the lowercase sha256 hex it is stored under.
func newAPIKey() (key, hash string) {
	var b [24]byte
	_, _ = rand.Read(b[:])
	key = "sk-" + hex.EncodeToString(b[:])
	sum := sha256.Sum256([]byte(key))
	return key, hex.EncodeToString(sum[:])
}
