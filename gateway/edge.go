package gateway

import (
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nuid"

	"github.com/switchyard-llm/switchyard/subjects"
)

// exposedHeaders are the response headers a browser script may read: the
// routing decision, the request id SDKs surface for support, and the
// rate-limit and retry hints.
func exposedHeaders() string {
	var names []string
	for _, rh := range subjects.RouteHeaders() {
		names = append(names, rh[1])
	}
	names = append(names, "X-Request-Id")
	for _, k := range subjects.PassThroughHeaders() {
		if !slices.Contains(names, k) {
			names = append(names, k)
		}
	}
	return strings.Join(names, ", ")
}

// edge wraps every route: the x-request-id every answer carries (the
// client's when valid, else a fresh one), CORS when origins are
// configured, and the bound on a request body left unread (letGo).
func (g *Gateway) edge(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody {
			b := &watchedBody{ReadCloser: r.Body}
			r.Body = b
			defer g.letGo(w, b, time.Now())
		}
		id := r.Header.Get("X-Request-Id")
		if !printable(id, 128) {
			id = nuid.Next()
		}
		w.Header().Set("X-Request-Id", id)
		if origin := r.Header.Get("Origin"); origin != "" && len(g.cfg.CORSOrigins) > 0 {
			if allow := g.corsAllow(origin); allow != "" {
				h := w.Header()
				h.Set("Access-Control-Allow-Origin", allow)
				h.Add("Vary", "Origin")
				if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
					preflight(w, r)
					return
				}
				h.Set("Access-Control-Expose-Headers", g.exposed)
			}
		}
		next.ServeHTTP(w, r)
	})
}

// corsAllow is the Access-Control-Allow-Origin for origin, "" when it is
// not allowed.
func (g *Gateway) corsAllow(origin string) string {
	if slices.Contains(g.cfg.CORSOrigins, origin) {
		return origin
	}
	if slices.Contains(g.cfg.CORSOrigins, "*") {
		return "*"
	}
	return ""
}

// preflight answers a CORS preflight: the SDKs send their own headers
// (x-stainless-*, x-api-key, anthropic-version), so the requested headers
// are reflected rather than listed.
func preflight(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS")
	if req := r.Header.Get("Access-Control-Request-Headers"); req != "" && len(req) <= 4096 {
		h.Set("Access-Control-Allow-Headers", req)
	}
	h.Set("Access-Control-Max-Age", "600")
	h.Add("Vary", "Access-Control-Request-Method")
	h.Add("Vary", "Access-Control-Request-Headers")
	w.WriteHeader(http.StatusNoContent)
}

// validOrigin checks a --cors-origin value: "*" or scheme://host[:port].
func validOrigin(o string) bool {
	if o == "*" {
		return true
	}
	rest, ok := strings.CutPrefix(o, "https://")
	if !ok {
		rest, ok = strings.CutPrefix(o, "http://")
	}
	return ok && rest != "" && !strings.ContainsAny(rest, "/?# ,\t\r\n*")
}
