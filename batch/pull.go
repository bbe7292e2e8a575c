package batch

import (
	"context"
	"sync"
	"time"

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

// run takes tenant's items while pctx lasts; each line runs under ctx.
func (p *pullers) run(pctx, ctx context.Context, tenant string) {
	b := p.b
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
			p.mu.Lock()
			delete(p.m, tenant) // the next supervision tries again
			p.mu.Unlock()
		}
		return
	}
	for pctx.Err() == nil {
		n := b.adm.room(tenant)
		if n <= 0 {
			t := time.NewTimer(100 * time.Millisecond)
			select {
			case <-pctx.Done():
			case <-b.adm.wake:
			case <-t.C:
			}
			t.Stop()
			continue
		}
		msgs, err := cons.Fetch(n, jetstream.FetchMaxWait(250*time.Millisecond))
		if err != nil {
			if pctx.Err() == nil {
				b.log.Debug("fetch", "tenant", tenant, "err", err)
				t := time.NewTimer(time.Second)
				select {
				case <-pctx.Done():
				case <-t.C:
				}
				t.Stop()
			}
			continue
		}
		for msg := range msgs.Messages() {
			rec := b.runnable(ctx, tenant, msg)
			if rec == nil {
				continue
			}
			b.adm.take(tenant)
			p.wg.Go(func() {
				defer b.adm.release(tenant)
				b.process(ctx, tenant, rec, msg)
			})
		}
	}
}
