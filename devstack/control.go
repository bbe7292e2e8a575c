package devstack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/auth"
	"github.com/switchyard-llm/switchyard/broker"
	"github.com/switchyard-llm/switchyard/natsconn"
	adapter "github.com/switchyard-llm/switchyard/replica-adapter"
)

// part is one component running under its own context, so a test can stop
// it alone (an adapter's SIGTERM, a broker's restart) while the rest runs.
type part struct {
	cancel  context.CancelFunc
	done    chan struct{}
	nc      *nats.Conn
	crashed atomic.Bool // stopped as by SIGKILL: its errors are expected
	// replica and engineURL let a stopped adapter start again; adapter is
	// the adapter an adapter part runs.
	replica   Replica
	engineURL string
	adapter   *adapter.Adapter
}

// startPart runs run on its own child of the stack's context.
func (s *Stack) startPart(what string, run func(context.Context) error, nc *nats.Conn) *part {
	ctx, cancel := context.WithCancel(s.runCtx)
	p := &part{cancel: cancel, done: make(chan struct{}), nc: nc}
	s.wg.Go(func() {
		defer close(p.done)
		if err := run(ctx); err != nil && !errors.Is(err, context.Canceled) && !p.crashed.Load() {
			s.log.Error("stopped with an error", "part", what, "err", err)
			s.errMu.Lock()
			s.errs = append(s.errs, fmt.Errorf("%s: %w", what, err))
			s.errMu.Unlock()
		}
	})
	return p
}

// stop ends the part as SIGTERM would and waits for it; its connection
// closes as the process's would.
func (p *part) stop() {
	p.cancel()
	<-p.done
	p.nc.Close()
}

func (s *Stack) startBroker(i int) error {
	nc, err := s.connect(fmt.Sprintf("switchyard-broker-%d", i), auth.Role{Kind: auth.RoleBroker})
	if err != nil {
		return err
	}
	stateDir := ""
	if s.cfg.DataDir != "" {
		stateDir = fmt.Sprintf("%s/broker-%d", s.cfg.DataDir, i)
	}
	b, err := broker.New(nc, broker.Config{ID: fmt.Sprintf("dev-broker-%d", i), StateDir: stateDir, Logger: s.log, Registerer: replacing{s.registry},
		TracerProvider: s.tracing.broker.Provider(), Stages: s.cfg.Stages})
	if err != nil {
		nc.Close()
		return err
	}
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	s.brokers[i] = b
	s.brokerParts[i] = s.startPart(fmt.Sprintf("broker %d", i), b.Run, nc)
	return nil
}

func (s *Stack) startAdapter(r Replica, engineURL string) error {
	maxBatch, maxQueue := r.Capacity()
	scheduling := r.EngineScheduling
	if r.EngineURL == "" {
		scheduling = adapter.SchedulingPriority
		if s.cfg.FCFSEngines {
			scheduling = adapter.SchedulingFCFS
		}
	}
	role := auth.Role{Kind: auth.RoleAdapter, ID: r.ID}
	if _, err := os.Stat(s.Creds(role)); err != nil {
		if _, err := s.auth.WriteCreds(s.credsDir, role); err != nil {
			return err
		}
	}
	nc, err := s.connect("switchyard-adapter-"+r.ID, role)
	if err != nil {
		return err
	}
	s.partsMu.Lock()
	feed := s.kvFeeds[r.ID]
	s.partsMu.Unlock()
	a, err := adapter.New(nc, adapter.Config{
		KVEvents: feed.Endpoint, KVEventsReplay: feed.Replay, KVEventsBind: r.KVEventsBind,
		Replica: r.ID, Model: r.Model, Version: r.Version, Pool: r.Pool, Region: r.Region, Flavor: "vllm", EngineScheduling: scheduling,
		EngineURL: engineURL, MaxBatch: maxBatch, MaxQueue: maxQueue, MaxLoras: r.MaxLoras, Endpoints: r.Endpoints, Role: r.Role,
		KeepaliveEvery: s.cfg.KeepaliveEvery, HeartbeatEvery: s.cfg.HeartbeatEvery,
		ScrapeEvery: s.cfg.ScrapeEvery, DrainGrace: s.cfg.DrainGrace,
		Logger: s.log, Registerer: replacing{s.registry}, TracerProvider: s.tracing.adapter.Provider(),
		Stages: s.cfg.Stages,
	})
	if err != nil {
		nc.Close()
		return err
	}
	p := s.startPart("adapter "+r.ID, a.Run, nc)
	p.replica, p.engineURL, p.adapter = r, engineURL, a
	s.partsMu.Lock()
	s.adapters[r.ID] = p
	s.partsMu.Unlock()
	return nil
}

// adapter is replica id's adapter part.
func (s *Stack) adapter(id string) (*part, error) {
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	if p := s.adapters[id]; p != nil {
		return p, nil
	}
	return nil, fmt.Errorf("devstack: no replica %q", id)
}

// StopReplica stops a replica's adapter as SIGTERM would: it marks itself
// draining (KV and heartbeat), lets its requests finish within the drain
// grace, deregisters, and returns. The engine keeps running.
func (s *Stack) StopReplica(id string) error {
	p, err := s.adapter(id)
	if err != nil {
		return err
	}
	p.stop()
	return nil
}

// CrashReplica stops a replica's adapter as SIGKILL would, as NATS sees
// it: its connection closes at once, so its subscriptions go and nothing
// more of it reaches NATS (no drain notice, no end of the replies in
// flight, no deregistration). The adapter is then stopped as on SIGTERM,
// unheard: its engine calls run on until they end or the drain grace does,
// and CrashReplica returns after. The engine keeps running; StartReplica
// starts the adapter again.
func (s *Stack) CrashReplica(id string) error {
	p, err := s.adapter(id)
	if err != nil {
		return err
	}
	p.crashed.Store(true)
	p.nc.Close() // first: nothing of the stop reaches NATS
	p.stop()
	return nil
}

// StartReplica starts a stopped replica's adapter again, in front of the
// same engine (a no-op while it runs).
func (s *Stack) StartReplica(id string) error {
	p, err := s.adapter(id)
	if err != nil {
		return err
	}
	select {
	case <-p.done:
	default:
		return nil
	}
	return s.startAdapter(p.replica, p.engineURL)
}

// StopBroker stops broker i as SIGTERM would.
func (s *Stack) StopBroker(i int) {
	s.partsMu.Lock()
	p := s.brokerParts[i]
	s.partsMu.Unlock()
	p.stop()
}

// StartBroker starts a new broker i, with the same id and state directory
// as the one stopped (a process restart).
func (s *Stack) StartBroker(i int) error {
	s.partsMu.Lock()
	p := s.brokerParts[i]
	s.partsMu.Unlock()
	select {
	case <-p.done:
	default:
		return nil
	}
	return s.startBroker(i)
}

// Faults returns the fault injector of a replica's simulated engine (nil
// for a replica with an EngineURL).
func (s *Stack) Faults(id string) *Faults {
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	return s.faults[id]
}

// NATSServer is the embedded server, e.g. to disable JetStream.
func (s *Stack) NATSServer() *server.Server {
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	return s.nats.Server()
}

// StopNATS shuts the embedded server down as a crash would: every part
// starts reconnecting. It needs Config.DataDir, so that StartNATS finds the
// JetStream store again.
func (s *Stack) StopNATS() error {
	if s.cfg.DataDir == "" {
		return errors.New("devstack: StopNATS needs Config.DataDir")
	}
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	if s.natsDown {
		return nil
	}
	s.nats.Shutdown()
	s.natsDown = true
	return nil
}

// StartNATS starts the embedded server again on the same address and store.
func (s *Stack) StartNATS() error {
	s.partsMu.Lock()
	defer s.partsMu.Unlock()
	if !s.natsDown {
		return nil
	}
	// The authorization as it is now: a revocation made meanwhile holds.
	trust, err := s.auth.Trust()
	if err != nil {
		return err
	}
	e, err := natsconn.StartEmbedded(natsconn.EmbeddedConfig{Listen: s.natsListen, StoreDir: s.storeDir, Logger: s.log, Trust: trust})
	if err != nil {
		return err
	}
	s.nats, s.natsDown = e, false
	return nil
}

// replacing registers collectors, replacing any registered before under the
// same descriptors: a restarted adapter or broker takes over its
// predecessor's series instead of failing to register.
type replacing struct{ *prometheus.Registry }

func (r replacing) Register(c prometheus.Collector) error {
	err := r.Registry.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		// Unregister by c: same descriptors, and the registry hands back
		// the existing collector unwrapped (without its const labels).
		r.Registry.Unregister(c)
		return r.Registry.Register(c)
	}
	return err
}

func (r replacing) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// KVEventsAddr is the address replica id's adapter listens on for its
// engine's KV-event feed (Replica.KVEventsBind, where a port of 0 is
// chosen by the system), "" until it listens or without one.
func (s *Stack) KVEventsAddr(id string) string {
	s.partsMu.Lock()
	p := s.adapters[id]
	s.partsMu.Unlock()
	if p == nil || p.adapter == nil {
		return ""
	}
	return p.adapter.KVEventsAddr()
}
