package budget

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A dead decider's lease is moved to spent whole when another finds it
// expired, and its holder listed in the record's expired list; once the
// holder's last deadline is past, a decider that has the key sums the
// ledger's records of the holder's requests (Config.Served) and corrects
// spent to hold that instead (the comment atop spend.go).

// expired is a dead holder's part of spent: Charged (what it moved there
// and its lease), to be corrected to what the ledger holds of its
// requests since Since once Until has passed.
type expired struct {
	Charged Micro `json:"charged"`
	Since   int64 `json:"since_unix_ms"`
	Until   int64 `json:"until_unix_ms"`
}

// ServedQuery asks the ledger for the records of Holder's requests charged
// to the budget Key, written at or after Since; Tenant, when set, is the
// only tenant whose records can be.
type ServedQuery struct {
	Key, Holder, Tenant string
	Since               time.Time
}

// correct sets spent's part of dead holder to what the ledger holds of its
// requests, and drops it from the expired list.
func (s *Spender) correct(ctx context.Context, sc *scope, holder string, e expired) error {
	s.mu.Lock()
	q := ServedQuery{Key: sc.key, Holder: holder, Since: time.UnixMilli(e.Since)}
	if sc.need.Kind == KindKey || sc.need.Name == sc.need.Tenant {
		q.Tenant = sc.need.Tenant
	}
	s.mu.Unlock()
	lctx, cancel := context.WithTimeout(ctx, ledgerTimeout)
	served, err := s.cfg.Served(lctx, q)
	cancel()
	if err != nil {
		return fmt.Errorf("%w: %s: the ledger of %s: %v", ErrUnavailable, sc.key, holder, err)
	}
	sc.io.Lock()
	defer sc.io.Unlock()
	for range maxTries {
		rec, rev, err := s.read(ctx, sc.key)
		if err != nil {
			return err
		}
		cur, ok := rec.Expired[holder]
		if !ok || rev == 0 {
			return nil // corrected by another decider
		}
		rec.Spent = max(rec.Spent+served-cur.Charged, 0)
		delete(rec.Expired, holder)
		b, _ := json.Marshal(rec)
		wctx, cancel := context.WithTimeout(ctx, opTimeout)
		nrev, err := s.cfg.KV.Update(wctx, sc.key, b, rev)
		cancel()
		s.mu.Lock()
		s.ops++
		if err == nil {
			sc.set(rec, nrev, s.cfg.Holder)
			sc.readAt = s.cfg.Now()
			s.mu.Unlock()
			return nil
		}
		sc.rev = 0
		s.mu.Unlock()
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return fmt.Errorf("%w: %s: %v", ErrUnavailable, sc.key, err)
		}
	}
	return fmt.Errorf("%w: %s: too many concurrent writers", ErrUnavailable, sc.key)
}
