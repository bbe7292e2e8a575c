package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/internal/check"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
	"github.com/switchyard-llm/switchyard/table/kv"
)

const keyUsage = "usage: switchyard key add --tenant T [--budget AMOUNT --budget-period PERIOD] | list [--tenant T] | revoke ID | budget ID AMOUNT|none PERIOD"

// keyIDLen is the length of the hash prefix `key list` shows as a key's id;
// `key revoke` takes at least minKeyIDLen of it.
const (
	keyIDLen    = 12
	minKeyIDLen = 8
)

// runKey adds, lists and revokes API keys. A key is printed once, when it
// is added; the table holds only its hash, and ids are prefixes of that.
func runKey(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("key", flag.ContinueOnError)
	var nf natsFlags
	nf.register(fs)
	tenant := fs.String("tenant", "", "tenant the key speaks for (add), or whose keys to list")
	budgetAmount := fs.String("budget", "", "the key's own spend budget, an amount of the table's currency (add; charged beside its tenant's)")
	budgetPeriod := fs.String("budget-period", "", "the budget's period: day, week, month or total (add; default month)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	var budget *table.Budget
	var budgetErr error
	switch {
	case len(pos) > 0 && pos[0] == "budget":
		if len(pos) == 4 {
			budget, budgetErr = parseKeyBudget("budget", pos[2], pos[3])
		}
	case *budgetAmount != "":
		budget, budgetErr = parseKeyBudget("--budget", *budgetAmount, cmp.Or(*budgetPeriod, table.PeriodMonth))
	case *budgetPeriod != "":
		budgetErr = usagef("--budget-period needs --budget")
	}
	if (*budgetAmount != "" || *budgetPeriod != "") && (len(pos) == 0 || pos[0] != "add") {
		budgetErr = usagef("--budget and --budget-period apply to add only (switchyard key budget ID AMOUNT PERIOD changes a key's)")
	}
	var tenantErr, argErr error
	if *tenant != "" || (len(pos) > 0 && pos[0] == "add") {
		tenantErr = check.Wrap("tenant", *tenant, subjects.ValidToken(*tenant))
	}
	switch {
	case len(pos) == 1 && (pos[0] == "add" || pos[0] == "list"):
	case len(pos) == 2 && pos[0] == "revoke":
		argErr = validKeyID(pos[1])
	case len(pos) == 4 && pos[0] == "budget":
		argErr = validKeyID(pos[1])
	default:
		argErr = usagef(keyUsage)
	}
	if err := checked(nf.validate(), tenantErr, argErr, budgetErr); err != nil {
		return err
	}
	bucket, _, closeConn, err := nf.openBucket(ctx, "switchyard-key")
	if err != nil {
		return err
	}
	defer closeConn()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	switch pos[0] {
	case "add":
		return addKey(cctx, bucket, *tenant, budget, stdout, stderr)
	case "list":
		return listKeys(cctx, bucket, *tenant, stdout)
	case "budget":
		return setKeyBudget(cctx, bucket, pos[1], budget, stdout)
	default:
		return revokeKey(cctx, bucket, pos[1], stdout)
	}
}

// parseKeyBudget reads a key's budget from the command line: an amount
// ("none": no budget) and a period; what names them is what, in errors.
func parseKeyBudget(what, amount, period string) (*table.Budget, error) {
	if amount == "none" {
		return nil, nil
	}
	limit, err := strconv.ParseFloat(amount, 64)
	if err != nil || math.IsNaN(limit) || math.IsInf(limit, 0) {
		return nil, usagef("%s: the amount %q is not a number (want one such as 50, or none)", what, amount)
	}
	b := &table.Budget{Limit: limit, Period: period}
	// The table's own check, so the command and `table put` refuse alike.
	v, _ := json.Marshal(table.Key{Tenant: "t", Budget: b})
	if _, err := table.Decode(table.PrefixKeys+strings.Repeat("0", 64), v); err != nil {
		var ke *table.KeyError
		if errors.As(err, &ke) {
			return nil, usagef("%s: %s: %v", what, ke.Field, ke.Err)
		}
		return nil, usagef("%s: %v", what, err)
	}
	return b, nil
}

// setKeyBudget sets (or, nil, removes) the budget of the key id names,
// compare-and-set on the entry read.
func setKeyBudget(ctx context.Context, bucket jetstream.KeyValue, id string, b *table.Budget, stdout io.Writer) error {
	k, err := findKey(ctx, bucket, id)
	if err != nil {
		return err
	}
	value, err := json.Marshal(table.Key{Tenant: k.tenant, Budget: b})
	if err != nil {
		return err
	}
	if _, err := table.Decode(table.PrefixKeys+k.hash, value); err != nil {
		return err
	}
	if _, err := bucket.Update(ctx, table.PrefixKeys+k.hash, value, k.revision); err != nil {
		return fmt.Errorf("key %s changed meanwhile, try again: %w", k.hash[:keyIDLen], err)
	}
	if b == nil {
		fmt.Fprintf(stdout, "key %s (tenant %s): no budget\n", k.hash[:keyIDLen], k.tenant)
		return nil
	}
	fmt.Fprintf(stdout, "key %s (tenant %s): budget %s per %s\n", k.hash[:keyIDLen], k.tenant, strconv.FormatFloat(b.Limit, 'f', -1, 64), b.Period)
	return nil
}

func addKey(ctx context.Context, bucket jetstream.KeyValue, tenant string, b *table.Budget, stdout, stderr io.Writer) error {
	key, hash := newAPIKey()
	value, err := json.Marshal(table.Key{Tenant: tenant, Budget: b})
	if err != nil {
		return err
	}
	k := table.PrefixKeys + hash
	if _, err := table.Decode(k, value); err != nil {
		return err
	}
	if _, err := bucket.Create(ctx, k, value); err != nil {
		return err
	}
	if _, err := bucket.Get(ctx, table.PrefixTenants+tenant); err != nil {
		fmt.Fprintf(stderr, "note: tenants.%s is not in the table yet; the key works, with default settings\n", tenant)
	}
	fmt.Fprintln(stdout, key)
	return nil
}

// apiKey is one keys.<hash> entry as `key list` shows it.
type apiKey struct {
	hash, tenant string
	budget       *table.Budget
	added        time.Time
	revision     uint64
}

// apiKeys reads every keys.* entry of the table.
func apiKeys(ctx context.Context, bucket jetstream.KeyValue) ([]apiKey, error) {
	var out []apiKey
	err := kv.Current(ctx, bucket, table.PrefixKeys+">", func(e jetstream.KeyValueEntry) error {
		v, err := table.Decode(e.Key(), e.Value())
		if err != nil {
			return err
		}
		k, isKey := v.V.(table.Key)
		if !isKey {
			return fmt.Errorf("%s: not an API key entry", e.Key())
		}
		out = append(out, apiKey{hash: strings.TrimPrefix(e.Key(), table.PrefixKeys), tenant: k.Tenant, budget: k.Budget, added: e.Created(), revision: e.Revision()})
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].added.Before(out[j].added) })
	return out, nil
}

func listKeys(ctx context.Context, bucket jetstream.KeyValue, tenant string, stdout io.Writer) error {
	keys, err := apiKeys(ctx, bucket)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTENANT\tADDED\tBUDGET")
	for _, k := range keys {
		if tenant == "" || k.tenant == tenant {
			b := "-"
			if k.budget != nil {
				b = strconv.FormatFloat(k.budget.Limit, 'f', -1, 64) + "/" + k.budget.Period
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", k.hash[:keyIDLen], k.tenant, k.added.UTC().Format(time.RFC3339), b)
		}
	}
	return tw.Flush()
}

// findKey is the one key whose hash id begins.
func findKey(ctx context.Context, bucket jetstream.KeyValue, id string) (apiKey, error) {
	keys, err := apiKeys(ctx, bucket)
	if err != nil {
		return apiKey{}, err
	}
	var match []apiKey
	for _, k := range keys {
		if strings.HasPrefix(k.hash, id) {
			match = append(match, k)
		}
	}
	switch len(match) {
	case 0:
		return apiKey{}, fmt.Errorf("no API key has id %s (switchyard key list shows them)", id)
	case 1:
		return match[0], nil
	}
	return apiKey{}, fmt.Errorf("id %s names %d keys: give more of it", id, len(match))
}

func revokeKey(ctx context.Context, bucket jetstream.KeyValue, id string, stdout io.Writer) error {
	k, err := findKey(ctx, bucket, id)
	if err != nil {
		return err
	}
	// Only the entry read is deleted: a key re-added meanwhile stays.
	if err := bucket.Delete(ctx, table.PrefixKeys+k.hash, jetstream.LastRevision(k.revision)); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "revoked %s (tenant %s)\n", k.hash[:keyIDLen], k.tenant)
	return nil
}

// validKeyID accepts a lowercase hex prefix of a key's hash.
func validKeyID(id string) error {
	if len(id) < minKeyIDLen || len(id) > sha256.Size*2 {
		return usagef("key id %q: %d to %d hex digits, as switchyard key list shows", id, minKeyIDLen, sha256.Size*2)
	}
	for _, c := range id {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return usagef("key id %q: lowercase hex digits only", id)
		}
	}
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
