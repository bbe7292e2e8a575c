package batch

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// pullers runs one consumer per tenant with running batches: tenants'
// items are taken side by side, each within its share of the window.
type pullers struct {
	b   *Batcher
	wg  *sync.WaitGroup // the lines' goroutines
	mu  sync.Mutex
	m   map[string]*puller
	pwg sync.WaitGroup // the pullers' goroutines
}

type puller struct{ cancel context.CancelFunc }

func newPullers(b *Batcher, wg *sync.WaitGroup) *pullers {
	return &pullers{b: b, wg: wg, m: map[string]*puller{}}
}

// set starts a puller for each tenant of active and stops the others. The
// lines a stopped puller started run on (under ctx).
func (p *pullers) set(ctx context.Context, active map[string]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if ctx.Err() != nil {
		return
	}
	p.b.adm.setActive(len(active))
	for t := range active {
		if p.m[t] != nil {
			continue
		}
		pctx, cancel := context.WithCancel(ctx)
		p.m[t] = &puller{cancel: cancel}
		p.pwg.Go(func() { p.run(pctx, ctx, t) })
	}
	for t, pl := range p.m {
		if _, ok := active[t]; !ok {
			pl.cancel()
			delete(p.m, t)
		}
	}
}

func (p *pullers) stop() {
	p.mu.Lock()
	for t, pl := range p.m {
		pl.cancel()
		delete(p.m, t)
	}
	p.mu.Unlock()
	p.pwg.Wait()
}

// run takes tenant's items while pctx lasts; each line runs under ctx. It
// opens the tenant's consumer again whenever a fetch says it is gone (its
// stream or its leader moved, a NATS server restarted without it) rather
// than fetching from nothing for ever.
func (p *pullers) run(pctx, ctx context.Context, tenant string) {
	b := p.b
	for pctx.Err() == nil {
		cons, err := b.items.CreateOrUpdateConsumer(pctx, jetstream.ConsumerConfig{
			Durable:           "batch-" + tenant,
			FilterSubject:     b.subj.BatchItemsOf(tenant),
			AckPolicy:         jetstream.AckExplicitPolicy,
			AckWait:           b.cfg.AckWait,
			MaxDeliver:        -1,
			MaxAckPending:     1 << 16,
			InactiveThreshold: 24 * time.Hour,
		})
		if err != nil {
			if pctx.Err() == nil {
				b.log.Warn("consumer", "tenant", tenant, "err", err)
				pause(pctx, nil, time.Second)
			}
			continue
		}
		err = p.pull(pctx, ctx, tenant, cons)
		if pctx.Err() == nil {
			b.log.Warn("consumer lost; opening it again", "tenant", tenant, "err", err)
			pause(pctx, nil, time.Second)
		}
	}
}

// pull fetches from cons while pctx lasts and there is room; it returns
// the error that says cons is gone.
func (p *pullers) pull(pctx, ctx context.Context, tenant string, cons jetstream.Consumer) error {
	b := p.b
	for pctx.Err() == nil {
		n := b.adm.room(tenant)
		if n <= 0 {
			pause(pctx, b.adm.wake, 100*time.Millisecond)
			continue
		}
		msgs, err := cons.Fetch(n, jetstream.FetchMaxWait(250*time.Millisecond))
		if err == nil {
			for msg := range msgs.Messages() {
				rec := b.runnable(ctx, tenant, msg)
				if rec == nil {
					continue
				}
				s := b.adm.take(tenant)
				p.wg.Go(func() {
					defer b.adm.release(tenant, s)
					b.process(ctx, tenant, rec, msg, s)
				})
			}
			err = msgs.Error()
		}
		switch {
		case err == nil, pctx.Err() != nil:
		case consumerGone(err):
			return err
		default:
			// The server or the link is away: the connection reconnects
			// and its pulls come back; do not spin meanwhile.
			b.log.Debug("fetch", "tenant", tenant, "err", err)
			pause(pctx, nil, time.Second)
		}
	}
	return pctx.Err()
}

// consumerGone reports whether a fetch's error says the consumer it pulls
// from is no more: fetching again from the same one would get nothing.
func consumerGone(err error) bool {
	return errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) ||
		errors.Is(err, nats.ErrNoResponders)
}

// pause waits d, or until wake has something or ctx ends.
func pause(ctx context.Context, wake <-chan struct{}, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-wake:
	case <-t.C:
	}
}
