package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/auth"
	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/internal/stages"
	"github.com/switchyard-llm/switchyard/loadgen"
	"github.com/switchyard-llm/switchyard/subjects"
)

// The nats-floor role is what the bus itself costs a request: a client
// and a responder on nats.go, each on a connection of its own over TCP
// to the stack's NATS server, under the identities Switchyard's own legs
// use (a gateway's and an adapter's), sending messages of the shapes
// Switchyard's legs had (stages.Legs: the same header lines, key and
// value lengths, and body sizes): the request, then the reply messages
// in order. The client is as lean as nats.go allows for each use: rounds
// one at a time take their replies on one synchronous subscription with
// NextMsg (the library's read loop hands each straight to the waiting
// goroutine); rounds at a fixed rate, many under way at once, share one
// wildcard subscription whose handler passes each reply to its round by
// the subject's last token, as nats.go's own request multiplexer does (a
// subscription per round cost the server and the client about twice the
// CPU). Nothing else runs in it: no engine, no HTTP on the measured path,
// no decision. The orchestrator gives it the shapes (POST /legs) and asks
// it for one round (GET /once) or a fixed rate (GET /run); it times the
// rounds itself.

// floorReplica is the adapter identity the responder runs under: a
// replica id the stack's table does not have, so no decider sends it
// anything.
const floorReplica = "floor-0"

// floorAccess is what the stack role gives the floor role: its NATS
// server and a creds file for each side.
type floorAccess struct {
	NATS           string `json:"nats"`
	ClientCreds    string `json:"client_creds"`
	ResponderCreds string `json:"responder_creds"`
	Prefix         string `json:"prefix"`
}

// floorHandlers serves the stack's side of the floor on its control
// listener: where the floor connects (GET /floor) and the shapes of the
// last request the gateway sent one at a time (GET /legs).
func floorHandlers(mux *http.ServeMux, st *devstack.Stack, rec *stages.Recorder) {
	mux.HandleFunc("GET /floor", func(w http.ResponseWriter, _ *http.Request) {
		a := floorAccess{NATS: st.NATSURL(), Prefix: subjects.DefaultPrefix,
			ClientCreds: st.Creds(auth.Role{Kind: auth.RoleGateway})}
		var err error
		if a.ResponderCreds, err = st.Auth().WriteCreds(st.CredsDir(), auth.Role{Kind: auth.RoleAdapter, ID: floorReplica}); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		writeJSONTo(w, a)
	})
	mux.HandleFunc("GET /legs", func(w http.ResponseWriter, _ *http.Request) { writeJSONTo(w, rec.Legs()) })
}

func writeJSONTo(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// Bounds of what a floor takes: no message body over 8 MiB, no more
// replies than the recorder keeps, no round over 32 MiB in all; a run of
// at most a million rounds, at most 4096 of them under way at once (a
// round past that fails, as an open loop counts a request it could not
// send).
const (
	maxFloorBody     = 8 << 20
	maxFloorHeaders  = 64
	maxFloorReplies  = 4096
	maxFloorRound    = 32 << 20
	maxFloorRounds   = 1_000_000
	maxFloorInFlight = 4096
)

// floorMsgs are the messages one round sends: built once per shape.
type floorMsgs struct {
	request *nats.Msg
	replies []*nats.Msg
}

// build turns shapes into messages: header keys of the recorded lengths
// (distinct, made of letters and digits), values and bodies of filler.
func build(l stages.Legs) (*floorMsgs, error) {
	if len(l.Replies) == 0 || len(l.Replies) > maxFloorReplies {
		return nil, fmt.Errorf("a round needs 1 to %d replies, not %d", maxFloorReplies, len(l.Replies))
	}
	msg := func(s stages.MsgShape) (*nats.Msg, error) {
		if s.Body < 0 || s.Body > maxFloorBody || len(s.Header) > maxFloorHeaders {
			return nil, errors.New("a message shape out of bounds")
		}
		m := &nats.Msg{Data: bytes.Repeat([]byte{'x'}, s.Body)}
		if len(s.Header) > 0 {
			m.Header = nats.Header{}
		}
		for i, kv := range s.Header {
			if kv[0] < 1 || kv[0] > 256 || kv[1] < 0 || kv[1] > 64<<10 {
				return nil, errors.New("a header line out of bounds")
			}
			m.Header.Add(headerKey(i, kv[0]), strings.Repeat("v", kv[1]))
		}
		return m, nil
	}
	total := 0
	for _, m := range append([]stages.MsgShape{l.Request}, l.Replies...) {
		total += max(m.Body, 0)
		for _, kv := range m.Header {
			total += max(kv[0], 0) + max(kv[1], 0)
		}
	}
	if total > maxFloorRound {
		return nil, fmt.Errorf("a round of %d bytes, more than %d", total, maxFloorRound)
	}
	var out floorMsgs
	var err error
	if out.request, err = msg(l.Request); err != nil {
		return nil, err
	}
	for _, s := range l.Replies {
		m, err := msg(s)
		if err != nil {
			return nil, err
		}
		out.replies = append(out.replies, m)
	}
	return &out, nil
}

// headerKey is the i-th distinct key of length n: its number in letters,
// padded with 'K' (keys of one letter repeat after 26, as lines of one
// key would).
func headerKey(i, n int) string {
	var b []byte
	for v := i; ; v /= 26 {
		b = append(b, byte('A'+v%26))
		if v < 26 {
			break
		}
	}
	for len(b) < n {
		b = append(b, 'K')
	}
	return string(b[:n])
}

// floor is the role's state: its two connections and the round's
// messages.
type floor struct {
	client, responder *nats.Conn
	subject, replyPfx string

	// onceMu makes rounds one at a time; onceSub takes their replies.
	onceMu  sync.Mutex
	onceSub *nats.Subscription

	msgs atomic.Pointer[floorMsgs] // what a round sends (nil: no legs set)

	mu sync.Mutex // guards waiting
	// waiting holds each round of a run under way by its reply token: the
	// channel its replies go to.
	waiting map[string]chan struct{}
	next    atomic.Uint64 // the last round's number: its reply subject's last token
}

func serveFloor(ctx context.Context, rc roleConfig) error {
	var a floorAccess
	if err := json.Unmarshal([]byte(rc.floor), &a); err != nil {
		return fmt.Errorf("-floor: %w", err)
	}
	f, err := newFloor(a)
	if err != nil {
		return err
	}
	defer f.close()
	mux := http.NewServeMux()
	mux.HandleFunc("POST /legs", f.setLegs)
	mux.HandleFunc("GET /once", f.serveOnce)
	mux.HandleFunc("GET /run", f.serveRun)
	ln, err := listen()
	if err != nil {
		return err
	}
	fmt.Printf("READY http://%s\n", ln.Addr())
	return serveUntil(ctx, &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, ln)
}

// newFloor connects the floor's two sides and subscribes them; close
// closes both connections.
func newFloor(a floorAccess) (*floor, error) {
	sj := subjects.New(a.Prefix)
	f := &floor{subject: sj.Replica(floorReplica), replyPfx: sj.ReplyPrefix("floor") + ".", waiting: map[string]chan struct{}{}}
	var err error
	if f.client, err = nats.Connect(a.NATS, nats.Name("bench-floor-client"), nats.UserCredentials(a.ClientCreds)); err != nil {
		return nil, err
	}
	if f.responder, err = nats.Connect(a.NATS, nats.Name("bench-floor-responder"), nats.UserCredentials(a.ResponderCreds)); err != nil {
		f.client.Close()
		return nil, err
	}
	if _, err = f.responder.Subscribe(f.subject, f.respond); err == nil {
		_, err = f.client.Subscribe(f.replyPfx+"run.*", f.take)
	}
	if err == nil {
		f.onceSub, err = f.client.SubscribeSync(f.replyPfx + "once.*")
	}
	if err == nil {
		err = errors.Join(f.client.Flush(), f.responder.Flush())
	}
	if err != nil {
		f.close()
		return nil, err
	}
	return f, nil
}

func (f *floor) close() {
	f.client.Close()
	f.responder.Close()
}

// respond is the responder: the reply messages, in order, to the
// request's reply subject. PublishMsg has written a message by the time
// it returns, so the shared messages are only read.
func (f *floor) respond(m *nats.Msg) {
	msgs := f.msgs.Load()
	if msgs == nil || !strings.HasPrefix(m.Reply, f.replyPfx) {
		return
	}
	for _, r := range msgs.replies {
		out := *r
		out.Subject = m.Reply
		if f.responder.PublishMsg(&out) != nil {
			return
		}
	}
}

func (f *floor) setLegs(w http.ResponseWriter, r *http.Request) {
	var l stages.Legs
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&l); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	msgs, err := build(l)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.msgs.Store(msgs)
}

// once sends one request and waits for all its replies: the time between.
// Its reply subject ends in a token of its own: a reply of an earlier
// round that gave up is skipped, not counted.
func (f *floor) once() (time.Duration, error) {
	f.onceMu.Lock()
	defer f.onceMu.Unlock()
	msgs := f.msgs.Load()
	reply := f.replyPfx + "once." + strconv.FormatUint(f.next.Add(1), 36)
	out := *msgs.request
	out.Subject, out.Reply = f.subject, reply
	deadline := time.Now().Add(5 * time.Second)
	start := time.Now()
	if err := f.client.PublishMsg(&out); err != nil {
		return 0, err
	}
	for got := 0; got < len(msgs.replies); {
		m, err := f.onceSub.NextMsg(time.Until(deadline))
		if err != nil {
			return 0, fmt.Errorf("the replies did not all come: %w", err)
		}
		if m.Subject == reply {
			got++
		}
	}
	return time.Since(start), nil
}

// take hands a reply to its round of a run, by the reply subject's last
// token.
func (f *floor) take(m *nats.Msg) {
	f.mu.Lock()
	ch := f.waiting[m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]]
	f.mu.Unlock()
	if ch != nil {
		select {
		case ch <- struct{}{}:
		default: // a round takes no more than its replies
		}
	}
}

// round is one round of a run: as once, its replies on the shared
// subscription.
func (f *floor) round() (time.Duration, error) {
	msgs := f.msgs.Load()
	token := strconv.FormatUint(f.next.Add(1), 36)
	ch := make(chan struct{}, len(msgs.replies))
	f.mu.Lock()
	if len(f.waiting) >= maxFloorInFlight {
		f.mu.Unlock()
		return 0, errors.New("too many rounds under way")
	}
	f.waiting[token] = ch
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.waiting, token)
		f.mu.Unlock()
	}()
	out := *msgs.request
	out.Subject, out.Reply = f.subject, f.replyPfx+"run."+token
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	start := time.Now()
	if err := f.client.PublishMsg(&out); err != nil {
		return 0, err
	}
	for range msgs.replies {
		select {
		case <-ch:
		case <-t.C:
			return 0, errors.New("the replies did not all come within 5s")
		}
	}
	return time.Since(start), nil
}

func (f *floor) ready(w http.ResponseWriter) bool {
	if f.msgs.Load() == nil {
		http.Error(w, "no legs set (POST /legs)", http.StatusConflict)
		return false
	}
	return true
}

func (f *floor) serveOnce(w http.ResponseWriter, _ *http.Request) {
	if !f.ready(w) {
		return
	}
	d, err := f.once()
	if err != nil {
		http.Error(w, err.Error(), http.StatusGatewayTimeout)
		return
	}
	writeJSONTo(w, floorRound{NS: int64(d)})
}

type floorRound struct {
	NS int64 `json:"ns"`
}

// floorRun is a fixed-rate run of rounds.
type floorRun struct {
	Requests int         `json:"requests"`
	Errors   int         `json:"errors"`
	Err      string      `json:"first_error,omitempty"`
	P50      loadgen.Dur `json:"p50_ms"`
	P99      loadgen.Dur `json:"p99_ms"`
}

// serveRun sends rounds at ?rate= per second for ?duration=, each on a
// goroutine of its own as it falls due (an open loop, as the generator
// sends), and answers when all have ended.
func (f *floor) serveRun(w http.ResponseWriter, r *http.Request) {
	if !f.ready(w) {
		return
	}
	q := r.URL.Query()
	rate, err1 := strconv.ParseFloat(q.Get("rate"), 64)
	d, err2 := time.ParseDuration(q.Get("duration"))
	n := int(rate * d.Seconds())
	if err1 != nil || err2 != nil || rate <= 0 || rate > 100000 || d <= 0 || d > 10*time.Minute || n > maxFloorRounds {
		http.Error(w, fmt.Sprintf("?rate= (0–100000) and ?duration= (up to 10m) are needed, for at most %d rounds", maxFloorRounds), http.StatusBadRequest)
		return
	}
	var mu sync.Mutex
	var run floorRun
	var ds []time.Duration
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		due := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		if wait := time.Until(due); wait > 0 {
			select {
			case <-time.After(wait):
			case <-r.Context().Done():
				wg.Wait()
				return
			}
		}
		wg.Go(func() {
			d, err := f.round()
			mu.Lock()
			defer mu.Unlock()
			run.Requests++
			if err != nil {
				run.Errors++
				if run.Err == "" {
					run.Err = err.Error()
				}
				return
			}
			ds = append(ds, d)
		})
	}
	wg.Wait()
	slices.Sort(ds)
	run.P50, run.P99 = loadgen.Dur(loadgen.Percentile(ds, 50)), loadgen.Dur(loadgen.Percentile(ds, 99))
	writeJSONTo(w, run)
}

// The orchestrator's side of the floor.

// startFloor starts the nats-floor role on the stack's NATS server.
func (b *bench) startFloor(ctx context.Context, exe string) error {
	if b.ctlURL == "" {
		return nil
	}
	var a floorAccess
	if err := b.getJSON(ctx, b.ctlURL+"/floor", &a); err != nil {
		return fmt.Errorf("the stack's floor access: %w", err)
	}
	access, err := json.Marshal(a)
	if err != nil {
		return err
	}
	c, err := startChild(ctx, exe, "nats-floor", "-role", "nats-floor", "-floor", string(access))
	if err != nil {
		return err
	}
	b.procs["nats-floor"] = c
	b.floorURL = c.urls[0]
	return nil
}

// floorLegs gives the floor the shapes of the last request Switchyard's
// gateway sent (and the replies it took).
func (b *bench) floorLegs(ctx context.Context) error {
	var l stages.Legs
	if err := b.getJSON(ctx, b.ctlURL+"/legs", &l); err != nil {
		return err
	}
	body, err := json.Marshal(l)
	if err != nil {
		return err
	}
	rc, err := fetch(ctx, http.MethodPost, b.floorURL+"/legs", bytes.NewReader(body))
	if err != nil {
		return err
	}
	return rc.Close()
}

// floorOnce is one round of the floor, timed by the floor.
func (b *bench) floorOnce(ctx context.Context) (time.Duration, error) {
	var r floorRound
	err := b.getJSON(ctx, b.floorURL+"/once", &r)
	return time.Duration(r.NS), err
}

// floorIdle is how long the stack's idle CPU (heartbeats, JetStream, the
// dashboard) is read before the floor's run, to be taken out of the NATS
// server's share.
const floorIdle = 5 * time.Second

// floorFixed runs the floor alone at the fixed rate, reading the CPU time
// of the floor and of the stack (whose NATS server carries the floor's
// messages) around it; the stack's CPU at rest, read just before, is
// taken out of the server's share.
func (b *bench) floorFixed(ctx context.Context) (*floorPhase, error) {
	if err := b.floorLegs(ctx); err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "== nats-floor alone at %g/s, %s\n", b.cfg.rate, b.cfg.duration)
	fp := &floorPhase{Load: b.settle(ctx)}
	rest := b.cpu()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(floorIdle):
	}
	before := b.cpu()
	start := time.Now()
	err := b.getJSON(ctx, fmt.Sprintf("%s/run?rate=%g&duration=%s", b.floorURL, b.cfg.rate, b.cfg.duration), &fp.Run)
	took := time.Since(start)
	after := b.cpu()
	if err != nil {
		return nil, err
	}
	fp.CPU = after["nats-floor"].minus(before["nats-floor"])
	idle := before["stack"].minus(rest["stack"])
	scale := func(d loadgen.Dur) loadgen.Dur { return loadgen.Dur(float64(d) * took.Seconds() / floorIdle.Seconds()) }
	fp.IdleCPU = cpuUse{User: scale(idle.User), Sys: scale(idle.Sys)}
	fp.ServerCPU = after["stack"].minus(before["stack"]).minus(fp.IdleCPU)
	fp.ServerCPU.User, fp.ServerCPU.Sys = max(fp.ServerCPU.User, 0), max(fp.ServerCPU.Sys, 0)
	fmt.Fprintf(os.Stderr, "   nats-floor %d rounds, %d errors %s, p50 %.3fms p99 %.3fms, CPU/request %s + server %s\n",
		fp.Run.Requests, fp.Run.Errors, fp.Run.Err, fp.Run.P50.Ms(), fp.Run.P99.Ms(),
		perRequest(fp.CPU, float64(fp.Run.Requests)), perRequest(fp.ServerCPU, float64(fp.Run.Requests)))
	return fp, nil
}

// floorPhase is the floor alone at the fixed rate: its rounds, its own
// CPU and the stack process's over them less what it uses at rest (the
// NATS server's share), and that rest, scaled to the run.
type floorPhase struct {
	Run       floorRun `json:"run"`
	CPU       cpuUse   `json:"cpu"`
	ServerCPU cpuUse   `json:"server_cpu"`
	IdleCPU   cpuUse   `json:"stack_idle_cpu"`
	Load      float64  `json:"loadavg_start"`
}

// perRequest is the floor's CPU per round, its server's share included.
func (fp *floorPhase) perRequest() time.Duration {
	if fp == nil || fp.Run.Requests == 0 {
		return 0
	}
	return (fp.CPU.total() + fp.ServerCPU.total()) / time.Duration(fp.Run.Requests)
}

func (b *bench) getJSON(ctx context.Context, url string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	rc, err := fetch(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	defer rc.Close()
	return json.NewDecoder(rc).Decode(v)
}

// fetch sends a request to one of the bench's own processes and returns
// the body of its 200 answer; any other status is an error that says what
// the answer said.
func fetch(ctx context.Context, method, url string, body io.Reader) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		return nil, fmt.Errorf("%s %s: %s %s", method, url, resp.Status, bytes.TrimSpace(msg))
	}
	return resp.Body, nil
}
