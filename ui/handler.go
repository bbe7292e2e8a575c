package ui

import (
	"embed"
	"encoding/json"
	"io/fs"
	"net/http"
	"strconv"
	"time"
)

// static is the page: index.html, app.js and style.css, served as they are.
//
//go:embed static
var static embed.FS

// writeTimeout bounds one write to a browser; keepalive keeps idle
// connections from being cut by proxies between pushes.
const (
	writeTimeout = 10 * time.Second
	keepalive    = 15 * time.Second
)

// client is one connected browser. Its channel is closed by the broadcaster
// when the browser falls behind, or when the dashboard stops.
type client struct {
	ch chan []byte
}

// Handler serves the dashboard under /ui: the page at /ui/, the pushes at
// /ui/events (text/event-stream, one "state" event per push) and the current
// state as JSON at /ui/state. Mount it at both "/ui" and "/ui/".
func (u *UI) Handler() http.Handler {
	page, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded folder is part of the binary
	}
	files := http.StripPrefix("/ui/", http.FileServerFS(page))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ui", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/ui/", http.StatusFound)
	})
	mux.HandleFunc("GET /ui/events", u.serveEvents)
	mux.HandleFunc("GET /ui/state", u.serveState)
	mux.HandleFunc("GET /ui/batches", u.serveBatches)
	mux.HandleFunc("GET /ui/budgets", u.serveBudgets)
	mux.HandleFunc("GET /ui/", func(w http.ResponseWriter, r *http.Request) {
		// Nothing but this origin: the page must work without the internet.
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:")
		w.Header().Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
	return mux
}

// Mounts is Handler under the patterns a gateway's Extra map takes.
func (u *UI) Mounts() map[string]http.Handler {
	h := u.Handler()
	return map[string]http.Handler{"/ui": h, "/ui/": h}
}

func (u *UI) serveState(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	s := u.state(time.Now(), true, 0, 0)
	u.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-cache")
	_ = json.NewEncoder(w).Encode(s)
}

func (u *UI) serveEvents(w http.ResponseWriter, r *http.Request) {
	c, first := u.register(time.Now())
	if c == nil {
		http.Error(w, "dashboard stopped", http.StatusServiceUnavailable)
		return
	}
	defer u.unregister(c)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	send := func(b []byte) error {
		_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
		if _, err := w.Write(b); err != nil {
			return err
		}
		return rc.Flush()
	}
	if send(first) != nil {
		return
	}
	t := time.NewTicker(keepalive)
	defer t.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case b, ok := <-c.ch:
			if !ok || send(b) != nil {
				return
			}
		case <-t.C:
			if send([]byte(": keepalive\n\n")) != nil {
				return
			}
		}
	}
}

// register adds a browser and returns the full state it starts from, or nil
// once the dashboard has stopped.
func (u *UI) register(now time.Time) (*client, []byte) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.stopped {
		return nil, nil
	}
	c := &client{ch: make(chan []byte, u.cfg.ClientBuffer)}
	if len(u.clients) == 0 {
		// Nobody waits for the pending delta: it starts after this snapshot.
		u.markPushed()
	}
	// Otherwise the next delta may repeat decisions this snapshot holds: the
	// page keeps a decision only once, by its seq.
	u.clients[c] = struct{}{}
	return c, event(u.state(now, true, 0, 0), "retry: 2000\n")
}

func (u *UI) unregister(c *client) {
	u.mu.Lock()
	delete(u.clients, c)
	u.mu.Unlock()
}

// push sends what changed since the last push to every browser. A browser
// whose buffer is full is dropped rather than waited for.
func (u *UI) push(now time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	rev := uint64(0)
	if t := u.table(); t != nil {
		rev = t.Revision
	}
	if !u.dirty && u.seq == u.pushedSeq && rev == u.pushedRev {
		return
	}
	if len(u.clients) == 0 {
		u.markPushed()
		return
	}
	b := event(u.state(now, false, u.pushedSeq, u.pushedRev), "")
	u.markPushed()
	for c := range u.clients {
		select {
		case c.ch <- b:
		default:
			u.log.Debug("dashboard client too slow; dropped")
			delete(u.clients, c)
			close(c.ch)
		}
	}
}

// markPushed records the current state as seen by every client.
// Lock should be held.
func (u *UI) markPushed() {
	u.pushedSeq, u.dirty = u.seq, false
	if t := u.table(); t != nil {
		u.pushedRev = t.Revision
	}
}

// stop disconnects every browser and refuses new ones.
func (u *UI) stop() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.stopped = true
	for c := range u.clients {
		delete(u.clients, c)
		close(c.ch)
	}
}

// event frames a state as one SSE "state" event. JSON from encoding/json
// holds no newline, so one data line carries it.
func event(s *State, prefix string) []byte {
	data, err := json.Marshal(s)
	if err != nil {
		data = []byte(`{"error":` + strconv.Quote(err.Error()) + `}`)
	}
	b := make([]byte, 0, len(prefix)+len(data)+32)
	b = append(b, prefix...)
	b = append(b, "event: state\ndata: "...)
	b = append(b, data...)
	return append(b, "\n\n"...)
}
