package adapter

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/switchyard-llm/switchyard/internal/clip"
	"github.com/switchyard-llm/switchyard/subjects"
)

// engineRoundTripper sits between the adapter and its engine: it adds the
// engine's API key to every call.
type engineRoundTripper struct {
	base http.RoundTripper
	auth string // "Bearer <key>", or "" without a key
}

func (t *engineRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.auth != "" {
		// RoundTrip must not modify the caller's request.
		req = req.Clone(req.Context())
		req.Header.Set("Authorization", t.auth)
	}
	return t.base.RoundTrip(req)
}

// judgeAnswer classifies the engine's answer to a request (POST under
// /v1/) for outlier ejection, and returns the answer to relay: an answer
// that is the replica's fault, not the client's, becomes a 503 the gateway
// retries elsewhere. Scrapes (/health, /metrics) are not requests and
// never count. lora is a call that names a LoRA adapter (a 404 for the
// model is then the tenant's adapter missing, relayed as it came, and
// never counts: one tenant's missing adapter must not eject every replica
// of the model); decode is a decode leg, a call with the kv_transfer_params
// of a prefill leg run elsewhere (its error answer, vLLM's 500 when the KV
// blocks cannot be loaded, says the prefill's blocks are gone, not that
// this engine fails: the request is prefilled here instead, and that
// call's answer counts).
func (e *engineHTTP) judgeAnswer(req *http.Request, resp *http.Response, err error, lora, decode bool) *http.Response {
	if req.Method != http.MethodPost || !strings.HasPrefix(req.URL.Path, "/v1/") {
		return resp
	}
	kind, ok := failureKind(req.Context(), resp, err)
	if err == nil && resp.StatusCode >= 400 && decode {
		kind, ok = "", false
	}
	status := 0
	if err == nil {
		status = resp.StatusCode
		if status == http.StatusNotFound && !lora {
			var gone bool
			if resp, gone = notServed(req, resp); gone {
				kind = "model"
			}
		}
	}
	e.outcomes.observe(kind, ok, status)
	if err == nil && (status == http.StatusUnauthorized || status == http.StatusForbidden) {
		resp = refusedKey(req, resp)
	}
	return resp
}

// outcomes is the engine's streak of failed answers, reported in every
// heartbeat (subjects.Heartbeat.EngineFailures): brokers eject a replica
// whose engine fails subjects.EjectAfterFailures requests in a row.
type outcomes struct {
	mu        sync.Mutex
	failures  int    // since the last success
	successes uint64 // ever
	authFail  bool   // the engine refused the key (401/403) and no success since

	onStreak   func()            // called when the streak reaches the ejection threshold
	onAuthFail func(int)         // called on the first 401/403 of a run, with the status
	onFailure  func(kind string) // counts every failure by kind
}

// failureKind classifies an engine answer: "" for a success or for what
// is not the engine's fault (a client's own 4xx, a request the client
// cancelled or whose deadline passed), else the kind of failure.
func failureKind(ctx context.Context, resp *http.Response, err error) (kind string, ok bool) {
	if err != nil {
		if ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return "", false
		}
		return "connection", false
	}
	switch s := resp.StatusCode; {
	case s < 400:
		return "", true
	case s == http.StatusUnauthorized || s == http.StatusForbidden:
		return "auth", false
	case s == http.StatusTooManyRequests:
		return "429", false
	case s >= 500:
		return "5xx", false
	}
	// The client's own 4xx: neither a success nor the engine's failure. A
	// 404 that says the engine does not serve the replica's model is the
	// replica's (notServed).
	return "", false
}

// observe counts one engine answer classified by failureKind; status is
// its HTTP status (0 when the call failed).
func (o *outcomes) observe(kind string, ok bool, status int) {
	o.mu.Lock()
	var streak, authFirst bool
	switch {
	case ok:
		o.failures, o.authFail = 0, false
		o.successes++
	case kind != "":
		o.failures++
		streak = o.failures == subjects.EjectAfterFailures
		if kind == "auth" && !o.authFail {
			o.authFail, authFirst = true, true
		}
	}
	o.mu.Unlock()
	if kind != "" && o.onFailure != nil {
		o.onFailure(kind)
	}
	if authFirst && o.onAuthFail != nil {
		o.onAuthFail(status)
	}
	if streak && o.onStreak != nil {
		o.onStreak()
	}
}

// clearAuth ends an auth failure once the engine took the key again.
func (o *outcomes) clearAuth() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	was := o.authFail
	o.authFail = false
	return was
}

func (o *outcomes) snapshot() (failures int, successes uint64, authFail bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.failures, o.successes, o.authFail
}

// watchEngine makes the engine's calls carry its key, and sets what a
// failure streak of its answers (judgeAnswer) does.
func (a *Adapter) watchEngine() {
	c := a.engine.client
	base := c.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	rt := &engineRoundTripper{base: base}
	if a.cfg.EngineAPIKey != "" {
		rt.auth = "Bearer " + a.cfg.EngineAPIKey
	}
	out := &a.engine.outcomes
	out.onFailure = func(kind string) { a.metrics.engineFailures.WithLabelValues(kind).Inc() }
	out.onStreak = a.publishHeartbeat
	out.onAuthFail = func(status int) {
		a.metrics.authFailures.Inc()
		a.log.Warn("engine refused the API key, heartbeat says scrape_ok=false", "status", status, "key_set", a.cfg.EngineAPIKey != "")
		a.publishHeartbeat()
	}
	cc := *c
	cc.Transport = rt
	a.engine.client = &cc
}

// checkAuth asks an engine that refused the key whether it takes it now:
// GET /v1/models needs the key where requests do (vLLM's --api-key guards
// /v1, not /health or /metrics). Without it, a replica marked unhealthy for
// its key would get no request that could clear it.
func (a *Adapter) checkAuth(ctx context.Context) {
	if _, _, failed := a.engine.outcomes.snapshot(); !failed {
		return
	}
	resp, err := a.get(ctx, "/v1/models")
	if err != nil {
		return
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK && a.engine.outcomes.clearAuth() {
		a.log.Info("engine accepts the API key again")
	}
}

// refusedKey replaces an engine's 401/403 with a 503: the engine refused
// the replica's credentials, not the client's, so the client must not hear
// invalid_api_key, and the gateway may retry on another replica.
func refusedKey(req *http.Request, resp *http.Response) *http.Response {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
	resp.Body.Close()
	return replaced(req, resp, "The engine refused this replica's API key ("+strconv.Itoa(resp.StatusCode)+"); the replica is marked unhealthy.")
}

// notServed replaces an engine's 404 that says the engine does not serve
// what the replica registered with a 503, and reports it (gone): the
// adapter sends only the model and the endpoints its replica registered,
// so such a 404 is the replica's fault, not the client's. The gateway
// tries another replica, and the answer counts toward this one's ejection
// as a 5xx does. Any other 404 (a stored response the engine no longer
// has) is the client's answer, relayed as it came.
func notServed(req *http.Request, resp *http.Response) (_ *http.Response, gone bool) {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	what, gone := notServing(b)
	if !gone {
		resp.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(b), resp.Body), resp.Body}
		return resp, false
	}
	resp.Body.Close()
	return replaced(req, resp, "The engine does not serve the "+what+" this replica registered (404: "+
		clip.Text(engineError(http.StatusNotFound, b).Message, 512)+"); the replica counts it as a failure."), true
}

// notServing reads an engine's 404 body: what is missing, the model
// (vLLM's "The model `x` does not exist.", OpenAI's code model_not_found)
// or the endpoint (FastAPI's {"detail":"Not Found"} for a path no route
// takes), or gone false when it says neither.
func notServing(body []byte) (what string, gone bool) {
	var raw map[string]json.RawMessage
	if json.Unmarshal(body, &raw) != nil {
		return "", false
	}
	if jsonString(raw["detail"]) == "Not Found" {
		return "endpoint", true
	}
	obj := raw
	if inner, ok := raw["error"]; ok {
		var nested map[string]json.RawMessage
		if json.Unmarshal(inner, &nested) == nil {
			obj = nested
		} else {
			obj = map[string]json.RawMessage{"message": inner} // TGI: {"error":"..."}
		}
	}
	msg := strings.ToLower(jsonString(obj["message"]))
	if jsonString(obj["code"]) == subjects.CodeModelNotFound || strings.Contains(msg, "model") {
		return "model", true
	}
	return "", false
}

// replaced is the 503 that stands for an engine answer that is the
// replica's fault: the gateway retries it on another replica.
func replaced(req *http.Request, resp *http.Response, msg string) *http.Response {
	body := subjects.NewError(http.StatusServiceUnavailable, subjects.CodeUpstreamError, msg).Body()
	h := http.Header{"Content-Type": {"application/json"}, "Retry-After": {"1"}}
	return &http.Response{
		Status: "503 Service Unavailable", StatusCode: http.StatusServiceUnavailable,
		Proto: resp.Proto, ProtoMajor: resp.ProtoMajor, ProtoMinor: resp.ProtoMinor,
		Header: h, Body: io.NopCloser(bytes.NewReader(body)), ContentLength: int64(len(body)), Request: req,
	}
}
