package budget

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/subjects"
)

// DefaultLedgerMaxAge is how long the ledger keeps a record unless
// `switchyard table init --ledger-max-age` says otherwise.
const DefaultLedgerMaxAge = 400 * 24 * time.Hour

// LedgerDuplicates is the ledger's duplicate window: a second record of a
// request (a retry, a continuation) within it is dropped.
const LedgerDuplicates = 10 * time.Minute

// Ensure creates the budgets bucket and the LEDGER stream on subjects of
// prefix when they are absent, with replicas, and sets the ledger's
// retention to maxAge. It reports what it did, one line each.
func Ensure(ctx context.Context, js jetstream.JetStream, prefix string, replicas int, maxAge time.Duration) ([]string, error) {
	var did []string
	_, err := js.KeyValue(ctx, subjects.BudgetsBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		_, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: subjects.BudgetsBucket, Description: "Switchyard budget spend and leases",
			History: 1, Replicas: replicas, Storage: jetstream.FileStorage,
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			err = nil
		}
		if err == nil {
			did = append(did, fmt.Sprintf("bucket %s created: %d replicas", subjects.BudgetsBucket, replicas))
		}
	}
	if err != nil {
		return did, fmt.Errorf("bucket %s: %w", subjects.BudgetsBucket, err)
	}
	cfg := jetstream.StreamConfig{
		Name: subjects.LedgerStream, Description: "Switchyard ledger: one record per settled request",
		Subjects: []string{subjects.New(prefix).LedgerAll()}, Storage: jetstream.FileStorage, Replicas: replicas,
		MaxAge: maxAge, Duplicates: min(LedgerDuplicates, maxAge), Retention: jetstream.LimitsPolicy, Discard: jetstream.DiscardOld,
	}
	s, err := js.Stream(ctx, subjects.LedgerStream)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		if _, err = js.CreateStream(ctx, cfg); err != nil {
			return did, fmt.Errorf("stream %s: %w", subjects.LedgerStream, err)
		}
		did = append(did, fmt.Sprintf("stream %s created: %d replicas, records kept %s", subjects.LedgerStream, replicas, FormatAge(maxAge)))
	case err != nil:
		return did, fmt.Errorf("stream %s: %w", subjects.LedgerStream, err)
	default:
		have := s.CachedInfo().Config
		if have.MaxAge != maxAge {
			have.MaxAge, have.Duplicates = maxAge, min(have.Duplicates, maxAge)
			if _, err := js.UpdateStream(ctx, have); err != nil {
				return did, fmt.Errorf("stream %s: %w", subjects.LedgerStream, err)
			}
			did = append(did, fmt.Sprintf("stream %s exists: records now kept %s", subjects.LedgerStream, FormatAge(maxAge)))
		} else {
			did = append(did, fmt.Sprintf("stream %s exists: %d replicas, records kept %s", subjects.LedgerStream, have.Replicas, FormatAge(maxAge)))
		}
	}
	return did, nil
}

// ParseAge reads a retention: a number of days ("400d") or a Go duration
// ("72h"), at least a minute.
func ParseAge(s string) (time.Duration, error) {
	var d time.Duration
	if n, ok := strings.CutSuffix(s, "d"); ok {
		days, err := strconv.Atoi(n)
		if err != nil || days <= 0 || days > 100*366 {
			return 0, fmt.Errorf("%q: want a number of days such as 400d, or a duration such as 72h", s)
		}
		d = time.Duration(days) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			return 0, fmt.Errorf("%q: want a number of days such as 400d, or a duration such as 72h", s)
		}
	}
	if d < time.Minute {
		return 0, fmt.Errorf("%q: at least a minute", s)
	}
	return d, nil
}

// FormatAge writes a retention in days when it is whole days.
func FormatAge(d time.Duration) string {
	if d%(24*time.Hour) == 0 {
		return strconv.Itoa(int(d/(24*time.Hour))) + "d"
	}
	return d.String()
}
