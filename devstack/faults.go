package devstack

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard-llm/switchyard/enginesim"
)

// Faults injects failures into one simulated engine, as seen from its
// adapter: a failing /health, inference calls answered with an error
// status, and the engine process dying and coming back. The zero value
// injects nothing; hand one to Config.Faults to have it in force from the
// first scrape, or take the stack's with Stack.Faults.
type Faults struct {
	health   atomic.Int32
	reject   atomic.Int32
	rejected atomic.Int64
	noModel  atomic.Bool

	mu   sync.Mutex
	host *engineHost
}

// SetHealth makes /health answer status (0: the engine's own answer). A
// replica whose /health never answered 200 stays "loading"; one whose
// scrapes fail past the adapter's limit heartbeats scrape_ok=false.
func (f *Faults) SetHealth(status int) { f.health.Store(int32(status)) }

// SetReject makes the inference endpoints answer status with an OpenAI
// error body, as an engine at capacity does with 429 or 503 (0: serve).
func (f *Faults) SetReject(status int) { f.reject.Store(int32(status)) }

// Rejected is the number of inference calls answered by SetReject or
// SetModelGone.
func (f *Faults) Rejected() int { return int(f.rejected.Load()) }

// SetModelGone makes the engine stop serving the model its replica
// registered, as one restarted with another --served-model-name: the
// inference calls reach the simulator asking for a model it does not
// have, and it answers its own 404 (vLLM's "The model `x` does not
// exist.").
func (f *Faults) SetModelGone(on bool) { f.noModel.Store(on) }

// Kill closes the engine's listener and every connection at once, as when
// its process dies: streams in flight break and new calls are refused.
func (f *Faults) Kill() {
	if h := f.engine(); h != nil {
		h.kill()
	}
}

// Restart brings a killed engine back on the same address.
func (f *Faults) Restart() error {
	h := f.engine()
	if h == nil {
		return errors.New("devstack: the engine has not started")
	}
	return h.restart()
}

func (f *Faults) engine() *engineHost {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.host
}

func (f *Faults) attach(h *engineHost) {
	f.mu.Lock()
	f.host = h
	f.mu.Unlock()
}

// wrap puts the faults in front of the engine's handler.
func (f *Faults) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if st := int(f.health.Load()); st != 0 && r.URL.Path == "/health" {
			w.WriteHeader(st)
			return
		}
		if st := int(f.reject.Load()); st != 0 && strings.HasPrefix(r.URL.Path, "/v1/") && r.Method == http.MethodPost {
			f.rejected.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(st)
			_, _ = w.Write([]byte(`{"object":"error","message":"injected: engine answers ` + strconv.Itoa(st) + `","type":"server_error","code":` + strconv.Itoa(st) + `}`))
			return
		}
		if f.noModel.Load() && strings.HasPrefix(r.URL.Path, "/v1/") && r.Method == http.MethodPost {
			f.rejected.Add(1)
			r = renamed(r, "not-served-here")
		}
		next.ServeHTTP(w, r)
	})
}

// renamed is r with its JSON body's model set to model.
func renamed(r *http.Request, model string) *http.Request {
	var body map[string]json.RawMessage
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<20)).Decode(&body); err != nil {
		body = map[string]json.RawMessage{}
	}
	body["model"], _ = json.Marshal(model)
	b, _ := json.Marshal(body)
	r2 := r.Clone(r.Context())
	r2.Body, r2.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
	return r2
}

// engineHost serves one simulated engine over HTTP behind its Faults, and
// can kill and restart the HTTP side while the engine model keeps running.
type engineHost struct {
	eng     *enginesim.Server
	handler http.Handler
	log     *slog.Logger
	addr    string

	mu   sync.Mutex
	srv  *http.Server // nil while killed
	done chan struct{}
	down bool // the stack is stopping: no restart
}

func newEngineHost(eng *enginesim.Server, f *Faults, log *slog.Logger) *engineHost {
	h := &engineHost{eng: eng, handler: f.wrap(eng.Handler()), log: log}
	f.attach(h)
	return h
}

// run drives the engine and serves ln until ctx ends, then stops the engine
// first (its open streams fail, so their handlers return) and the HTTP side
// after, as enginesim.Server.Serve does.
func (h *engineHost) run(ctx context.Context, ln net.Listener) error {
	h.addr = ln.Addr().String()
	h.mu.Lock()
	h.serveLocked(ln)
	h.mu.Unlock()
	err := h.eng.Run(ctx)
	h.mu.Lock()
	h.down = true
	h.mu.Unlock()
	h.shutdown()
	return err
}

// Lock should be held.
func (h *engineHost) serveLocked(ln net.Listener) {
	srv := &http.Server{Handler: h.handler, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(h.log.Handler(), slog.LevelWarn)}
	done := make(chan struct{})
	h.srv, h.done = srv, done
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			h.log.Error("engine HTTP stopped", "addr", h.addr, "err", err)
		}
	}()
}

func (h *engineHost) kill() {
	h.mu.Lock()
	srv, done := h.srv, h.done
	h.srv = nil
	h.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
		<-done
	}
}

func (h *engineHost) restart() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.down {
		return errors.New("devstack: the stack is stopping")
	}
	if h.srv != nil {
		return nil
	}
	ln, err := net.Listen("tcp", h.addr)
	if err != nil {
		return err
	}
	h.serveLocked(ln)
	return nil
}

func (h *engineHost) shutdown() {
	h.mu.Lock()
	srv, done := h.srv, h.done
	h.srv = nil
	h.mu.Unlock()
	if srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if srv.Shutdown(ctx) != nil {
		_ = srv.Close()
	}
	<-done
}
