package adapter

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/switchyard-llm/switchyard/subjects"
)

// service is the adapter's micro service and the flavor its metadata
// names. micro's metadata is fixed when the service is added, so a flavor
// detected later (the engine was not up yet) means adding it again.
type service struct {
	mu     sync.Mutex
	svc    micro.Service
	flavor string
}

func (s *service) start(a *Adapter) error {
	flavor := a.detectedFlavor()
	svc, err := a.startService(flavor)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.svc, s.flavor = svc, flavor
	s.mu.Unlock()
	return nil
}

// refresh adds the service again once the flavor is detected, while the
// replica is still loading: no broker sends it requests then, so none can
// fall into the moment between the two services. A replica already ready
// keeps its service (and its metadata) rather than risk a request.
func (s *service) refresh(a *Adapter) {
	flavor := a.detectedFlavor()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.svc == nil || flavor == s.flavor || a.state() != subjects.StateLoading {
		return
	}
	if err := s.svc.Stop(); err != nil {
		a.log.Warn("stopping micro service to name the flavor", "err", err)
		return
	}
	svc, err := a.startService(flavor)
	if err != nil {
		a.log.Error("micro service not restarted", "err", err)
		s.svc = nil
		return
	}
	s.svc, s.flavor = svc, flavor
}

func (s *service) stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.svc == nil {
		return nil
	}
	return s.svc.Stop()
}

// detectedFlavor is the flavor the engine's metrics were read as, else the
// configured one.
func (a *Adapter) detectedFlavor() string {
	a.load.mu.Lock()
	defer a.load.mu.Unlock()
	if a.load.flavor != "" {
		return a.load.flavor
	}
	return a.cfg.Flavor
}

// probeFlavor reads the engine's metrics once to learn its flavor, and
// nothing else: health and load are the scrape loop's, so the first
// heartbeat still reports what the first full scrape found.
func (a *Adapter) probeFlavor(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, max(a.cfg.ScrapeEvery, time.Second))
	defer cancel()
	if _, flavor, err := a.metricsSample(ctx); err == nil {
		a.load.mu.Lock()
		a.load.flavor = flavor
		a.load.mu.Unlock()
	}
}
