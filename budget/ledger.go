package budget

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/subjects"
)

// ReadLedger calls fn with every record of the LEDGER stream, in order,
// of tenant (every tenant for "") written at or after since (all when
// zero), up to the last record there when it began. It needs an identity
// that may read the stream: operators may, tenants never.
func ReadLedger(ctx context.Context, js jetstream.JetStream, prefix, tenant string, since time.Time, fn func(*subjects.LedgerRecord) error) error {
	s, err := js.Stream(ctx, subjects.LedgerStream)
	if err != nil {
		return err
	}
	if s.CachedInfo().State.Msgs == 0 {
		return nil
	}
	cfg := jetstream.OrderedConsumerConfig{}
	if tenant != "" {
		cfg.FilterSubjects = []string{subjects.New(prefix).Ledger(tenant)}
	}
	if !since.IsZero() {
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	c, err := s.OrderedConsumer(ctx, cfg)
	if err != nil {
		return err
	}
	for {
		batch, err := c.Fetch(1000, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return err
		}
		n, done := 0, false
		var ferr error
		// The batch is read to its end whatever happens: its fetch
		// goroutine ends only then.
		for m := range batch.Messages() {
			n++
			if done || ferr != nil {
				continue
			}
			md, err := m.Metadata()
			if err != nil {
				ferr = err
				continue
			}
			var r subjects.LedgerRecord
			if json.Unmarshal(m.Data(), &r) == nil {
				ferr = fn(&r)
			}
			done = md.NumPending == 0
		}
		if ferr != nil {
			return ferr
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return err
		}
		if done || n == 0 {
			return nil // the last record, or nothing (more) matched within the wait
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// Served is a Config.Served that sums the LEDGER stream as js may read
// it: the cost of the records of q.Holder's requests charged to q.Key.
func Served(js jetstream.JetStream, prefix string) func(context.Context, ServedQuery) (Micro, error) {
	return func(ctx context.Context, q ServedQuery) (Micro, error) {
		var sum Micro
		err := ReadLedger(ctx, js, prefix, q.Tenant, q.Since, func(r *subjects.LedgerRecord) error {
			if r.Holder == q.Holder && (r.Budgets[0] == q.Key || r.Budgets[1] == q.Key) && r.CostMicro > 0 {
				sum += Micro(r.CostMicro)
			}
			return nil
		})
		return sum, err
	}
}
