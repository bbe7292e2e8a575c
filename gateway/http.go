package gateway

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// routes builds the public mux and, with AdminListen set, the admin one
// that the dashboard and /metrics move to (nil otherwise: they are public).
func (g *Gateway) routes() (public, admin *http.ServeMux) {
	mux := http.NewServeMux()
	for _, ep := range subjects.AllEndpoints() {
		mux.HandleFunc("POST "+ep, g.traced(ep, g.serveInference(ep)))
	}
	stored := g.traced(subjects.EndpointResponses+"/{id}", g.serveStored)
	mux.HandleFunc("GET "+subjects.EndpointResponses+"/{id}", stored)
	mux.HandleFunc("DELETE "+subjects.EndpointResponses+"/{id}", stored)
	mux.HandleFunc("POST /v1/files", g.serveFileUpload)
	mux.HandleFunc("GET /v1/files", g.serveFiles)
	mux.HandleFunc("GET /v1/files/{id}", g.serveFile)
	mux.HandleFunc("DELETE /v1/files/{id}", g.serveFile)
	mux.HandleFunc("GET /v1/files/{id}/content", g.serveFileContent)
	mux.HandleFunc("POST /v1/batches", g.serveBatchCreate)
	mux.HandleFunc("GET /v1/batches", g.serveBatches)
	mux.HandleFunc("GET /v1/batches/{id}", g.serveBatch)
	mux.HandleFunc("POST /v1/batches/{id}/cancel", g.serveBatchCancel)
	mux.HandleFunc("GET /v1/usage", g.serveUsage)
	mux.HandleFunc("GET /v1/models", g.serveModels)
	mux.HandleFunc("GET /v1/models/{id...}", g.serveModel)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", g.serveReady)
	mux.HandleFunc("/", g.serveNotFound)
	adm := mux
	if g.cfg.AdminListen != "" {
		admin = http.NewServeMux()
		adm = admin
	}
	if g.cfg.Gatherer != nil {
		adm.Handle("GET /metrics", promhttp.HandlerFor(g.cfg.Gatherer, promhttp.HandlerOpts{}))
	}
	for p, h := range g.cfg.Extra {
		adm.Handle(p, h)
	}
	return mux, admin
}

func (g *Gateway) serveNotFound(w http.ResponseWriter, r *http.Request) {
	d := dialectOf(r.URL.Path)
	if allow := allowFor(r.URL.Path); allow != "" {
		w.Header().Set("Allow", allow)
		writeErrorAs(w, d, subjects.NewError(http.StatusMethodNotAllowed, subjects.CodeMethodNotAllowed, "method "+r.Method+" is not allowed on "+r.URL.Path))
		return
	}
	writeErrorAs(w, d, subjects.NewError(http.StatusNotFound, subjects.CodeNotFound, "unknown path "+r.URL.Path))
}

// allowFor is the Allow header of a known path, "" for an unknown one.
func allowFor(p string) string {
	switch {
	case p == "/v1/models", strings.HasPrefix(p, "/v1/files/") && strings.HasSuffix(p, "/content"):
		return "GET"
	case p == "/v1/files", p == "/v1/batches":
		return "GET, POST"
	case strings.HasPrefix(p, "/v1/files/") && strings.Count(p, "/") == 3:
		return "GET, DELETE"
	case strings.HasPrefix(p, "/v1/batches/") && strings.HasSuffix(p, "/cancel"):
		return "POST"
	case strings.HasPrefix(p, "/v1/batches/") && strings.Count(p, "/") == 3:
		return "GET"
	case subjects.EndpointBit(p) != 0:
		return "POST"
	case strings.HasPrefix(p, subjects.EndpointResponses+"/") && !strings.Contains(p[len(subjects.EndpointResponses)+1:], "/"):
		return "GET, DELETE"
	}
	return ""
}

// writeError renders e in the OpenAI shape with its retry headers.
func writeError(w http.ResponseWriter, e *subjects.APIError) { writeErrorAs(w, dialectOpenAI, e) }

// writeErrorAs renders e in d's shape with its retry headers.
func writeErrorAs(w http.ResponseWriter, d dialect, e *subjects.APIError) {
	h := w.Header()
	for _, kv := range e.RetryAfterHeaders() {
		h.Set(kv[0], kv[1])
	}
	for k, v := range e.Headers {
		h.Set(k, v)
	}
	h.Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	_, _ = w.Write(d.errorBody(e))
}

func (g *Gateway) fail(w http.ResponseWriter, u *upstream, e *subjects.APIError) {
	if e == nil {
		e = subjects.NewError(502, subjects.CodeUpstreamError, "no replica could serve the request")
	}
	d := dialectOpenAI
	if u != nil {
		d = u.dialect
		g.metrics.done(u, e.Status)
	}
	writeErrorAs(w, d, e)
}

func (g *Gateway) writeRaw(w http.ResponseWriter, u *upstream, status int, ct string, body []byte) {
	h := w.Header()
	if ct != "" {
		h.Set("Content-Type", ct)
	} else if h.Get("Content-Type") == "" {
		h.Set("Content-Type", "application/json")
	}
	body = u.dialect.translate(status, body)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
	g.metrics.done(u, status)
}

// tenantOf maps the API key to a tenant through keys.<sha256 hex>. The key
// comes in Authorization: Bearer, or in x-api-key (the Anthropic SDKs'
// header) when there is no Authorization. A key that is not in the table is
// refused even with allow_anonymous on: anonymous means no key at all, so a
// mistyped key fails loudly instead of being served as tenant "default".
func (g *Gateway) tenantOf(r *http.Request, t *table.Snapshot) (string, *subjects.APIError) {
	tenant, _, e := g.keyOf(r, t)
	return tenant, e
}

// keyOf is the tenant the request's API key speaks for and the key's hash,
// the name of its keys.* entry ("" when anonymous).
func (g *Gateway) keyOf(r *http.Request, t *table.Snapshot) (tenant, hash string, _ *subjects.APIError) {
	auth, xkey := r.Header.Values("Authorization"), r.Header.Values("X-Api-Key")
	if len(auth) == 0 && len(xkey) == 0 {
		if t.Policy.AllowAnonymous {
			return table.DefaultTenant, "", nil
		}
		return "", "", subjects.NewError(401, subjects.CodeInvalidAPIKey, "missing API key: send Authorization: Bearer <key> (or x-api-key: <key>)")
	}
	var key string
	if len(auth) > 0 {
		scheme, k, _ := strings.Cut(strings.TrimSpace(auth[0]), " ")
		if !strings.EqualFold(scheme, "Bearer") || len(auth) > 1 {
			key = ""
		} else {
			key = strings.TrimSpace(k)
		}
	} else if len(xkey) == 1 {
		key = strings.TrimSpace(xkey[0])
	}
	if key == "" {
		return "", "", subjects.NewError(401, subjects.CodeInvalidAPIKey, "malformed API key header: send one Authorization: Bearer <key> (or x-api-key: <key>)")
	}
	sum := sha256.Sum256([]byte(key))
	hash = hex.EncodeToString(sum[:])
	if k, ok := t.Keys[hash]; ok {
		// The tenant is a token of the subjects the request goes out on:
		// checked here, where it is read, for every handler that uses it.
		if err := subjects.ValidToken(k.Tenant); err != nil {
			return "", "", subjects.NewError(400, subjects.CodeInvalidRequest, "tenant: "+err.Error())
		}
		return k.Tenant, hash, nil
	}
	return "", "", subjects.NewError(401, subjects.CodeInvalidAPIKey, "unknown API key")
}

func (g *Gateway) snapshot(w http.ResponseWriter) *table.Snapshot {
	t := g.table.Load()
	if t == nil {
		e := subjects.NewError(503, subjects.CodeRouterUnavailable, "the routing table is not loaded yet")
		e.RetryAfter = time.Second
		writeError(w, e)
	}
	return t
}

// serveReady is 200 when NATS is connected and its link answers pings, the
// table is loaded and a broker answers a micro ping (checked at most once a
// second).
func (g *Gateway) serveReady(w http.ResponseWriter, r *http.Request) {
	if err := g.ready(); err != nil {
		e := subjects.NewError(503, subjects.CodeRouterUnavailable, "not ready: "+err.Error())
		e.RetryAfter = time.Second
		writeError(w, e)
		return
	}
	_, _ = io.WriteString(w, "ready\n")
	if d := g.tableUnreachable(); d > 0 {
		// Ready still: it routes on the last good table, as the seed asks
		// of a router whose control plane is out of reach.
		_, _ = io.WriteString(w, "routing table: the last good one; its bucket out of reach for "+d.Round(time.Second).String()+"\n")
	}
}

// tableUnreachable is how long the table's bucket has been out of reach
// (0: in reach, or the watch not started).
func (g *Gateway) tableUnreachable() time.Duration {
	if w := g.watcherRef.Load(); w != nil {
		return w.Unreachable()
	}
	return 0
}

func (g *Gateway) ready() error {
	g.readyMu.Lock()
	defer g.readyMu.Unlock()
	if time.Since(g.readyAt) < time.Second && g.readyErr == nil {
		return nil
	}
	g.readyAt = time.Now()
	g.readyErr = g.checkReady()
	return g.readyErr
}

func (g *Gateway) checkReady() error {
	// The link itself first: a probe that finds it silent stops new
	// requests at once, as it tells the prober.
	if g.probeCtx != nil && !g.silent.Load() {
		g.awaitPong(g.probeCtx, g.cfg.LinkCheck)
	}
	if g.silent.Load() {
		return errors.New("the NATS link is silent")
	}
	if !g.nc.IsConnected() {
		return errors.New("NATS is not connected")
	}
	if g.table.Load() == nil {
		return errors.New("routing table not loaded")
	}
	if g.dec != nil {
		// It decides itself: ready once it has heard the replicas its
		// table has ready (or waited WarmUp for them).
		if !g.warm.Load() {
			return errors.New("waiting for the replicas' heartbeats")
		}
	} else if _, err := g.nc.Request("$SRV.PING."+subjects.BrokerService, nil, 500*time.Millisecond); err != nil {
		return errors.New("no broker answers: " + err.Error())
	}
	if g.cfg.Ready != nil {
		return g.cfg.Ready()
	}
	return nil
}

// newTraceparent starts a W3C trace when the client sent none.
func newTraceparent() string {
	var b [24]byte
	_, _ = rand.Read(b[:])
	return "00-" + hex.EncodeToString(b[:16]) + "-" + hex.EncodeToString(b[16:]) + "-01"
}
