package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	httppprof "net/http/pprof"
	"net/url"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"time"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/enginesim"
	"github.com/switchyard-llm/switchyard/internal/gctune"
	"github.com/switchyard-llm/switchyard/internal/stages"
	"github.com/switchyard-llm/switchyard/table"
)

// A role is one process of the benchmark: it serves until ctx ends or its
// stdin closes (the orchestrator went away), after printing one line
// "READY <url> [<control url>]" on stdout.

type roleConfig struct {
	engineURL          string
	model              string
	ttft, itl          time.Duration
	maxBatch, maxQueue int    // the capacity Switchyard's replica declares
	busyLoops          int    // the busy role's spinning goroutines
	floor              string // the nats-floor role's floorAccess, JSON
}

func runRole(ctx context.Context, role string, rc roleConfig) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // owned by this role: ends with the process, or cancels it
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	switch role {
	case "engine":
		return serveEngine(ctx, rc)
	case "proxy":
		return serveProxy(ctx, rc)
	case "stack":
		return serveStack(ctx, rc)
	case "nats-floor":
		return serveFloor(ctx, rc)
	case "busy":
		return spin(ctx, rc.busyLoops)
	}
	return fmt.Errorf("unknown role %q", role)
}

func listen() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }

// spin is the busy role: n loops that only burn CPU, each on a thread of its
// own, as n `while :; do :; done` shells beside the stack would, until ctx
// ends. It prints "READY busy".
func spin(ctx context.Context, n int) error {
	if n < 1 {
		return fmt.Errorf("the busy role needs at least one loop")
	}
	runtime.GOMAXPROCS(n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			runtime.LockOSThread()
			for ctx.Err() == nil {
				for i := 0; i < 1<<20; i++ { // about a millisecond between looks at ctx
				}
			}
		})
	}
	fmt.Println("READY busy")
	wg.Wait()
	return nil
}

// serveEngine is the engine every path ends at: fixed TTFT and ITL however
// loaded, so that the paths in front of it are what differs.
func serveEngine(ctx context.Context, rc roleConfig) error {
	eng := enginesim.NewServer(enginesim.ServerConfig{
		Engine: enginesim.Config{Model: rc.model, TTFTBase: rc.ttft, ITL: rc.itl},
		Fixed:  true,
		Logger: slog.New(slog.DiscardHandler),
	})
	ln, err := listen()
	if err != nil {
		return err
	}
	fmt.Printf("READY http://%s\n", ln.Addr())
	return eng.Serve(ctx, ln)
}

// serveProxy is the router that decides nothing: httputil.ReverseProxy with
// streams flushed at once and a connection pool as large as the adapter's.
func serveProxy(ctx context.Context, rc roleConfig) error {
	target, err := url.Parse(rc.engineURL)
	if err != nil {
		return err
	}
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 1 << 16,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	defer tr.CloseIdleConnections()
	rp := &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		Transport:     tr,
		FlushInterval: -1,
		ErrorLog:      slog.NewLogLogger(slog.DiscardHandler, slog.LevelError),
	}
	// Full duplex: once the proxy has flushed the engine's response headers,
	// the HTTP/1 server closes the unread request body, and the transport's
	// final read of it (to check it was no longer than declared) then fails
	// and tears down the connection to the engine mid-stream
	// (golang/go#40747). Streams through a plain ReverseProxy are cut now and
	// then without this.
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).EnableFullDuplex()
		rp.ServeHTTP(w, r)
	})
	ln, err := listen()
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	fmt.Printf("READY http://%s\n", ln.Addr())
	return serveUntil(ctx, hs, ln)
}

// serveStack is Switchyard as `switchyard dev` runs it (embedded NATS, one
// broker, the gateway, the dev routing table) with one replica whose
// adapter calls the shared engine. A second listener serves CPU profiles.
func serveStack(ctx context.Context, rc roleConfig) error {
	defer gctune.Start()() // as the switchyard binary runs
	dir, err := os.MkdirTemp("", "switchyard-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// Every request's stages are recorded (internal/stages): a few map
	// operations a stage, the cost of knowing where the time goes.
	rec := stages.New(1)
	st, err := devstack.Start(ctx, devstack.Config{
		Listen: "127.0.0.1:0", NATSListen: "127.0.0.1:-1", DataDir: dir, Stages: rec,
		Replicas: []devstack.Replica{{
			ID: "bench-0", Model: rc.model, Version: "v1.0.0", Pool: table.PoolGeneral,
			KVBlocks: 8192, EngineURL: rc.engineURL, MaxBatch: rc.maxBatch, MaxQueue: rc.maxQueue,
		}},
	})
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = st.Ready(rctx)
	cancel()
	if err != nil {
		return errors.Join(err, st.Close())
	}
	ln, err := listen()
	if err != nil {
		return errors.Join(err, st.Close())
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /cpu", cpuProfile)
	mux.HandleFunc("GET /goroutines", serveGoroutines)
	mux.Handle("GET /heap", httppprof.Handler("heap"))
	stageHandlers(mux, st, rec)
	floorHandlers(mux, st, rec)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	fmt.Printf("READY %s http://%s\n", st.GatewayURL(), ln.Addr())
	err = serveUntil(ctx, hs, ln)
	return errors.Join(err, st.Close())
}

// cpuProfile writes a CPU profile of ?seconds=N (default 10).
func cpuProfile(w http.ResponseWriter, r *http.Request) {
	secs, err := strconv.Atoi(r.URL.Query().Get("seconds"))
	if err != nil || secs <= 0 {
		secs = 10
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	if err := pprof.StartCPUProfile(w); err != nil {
		http.Error(w, err.Error(), http.StatusConflict)
		return
	}
	select {
	case <-time.After(time.Duration(secs) * time.Second):
	case <-r.Context().Done():
	}
	pprof.StopCPUProfile()
}

func serveUntil(ctx context.Context, hs *http.Server, ln net.Listener) error {
	done := make(chan error, 1)
	go func() { done <- hs.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		_ = hs.Close()
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
