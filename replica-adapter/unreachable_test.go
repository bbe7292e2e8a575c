package adapter_test

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
)

// TestUnreachableEngineMarksTheReplicaUnhealthy: a request that cannot
// connect to the engine is answered 503 (retryable elsewhere) and the next
// heartbeat, sent at once, says scrape_ok=false, long before the scraper
// would have noticed. When the engine is back, its first answer to a
// request ends the mark, again without a scrape.
func TestUnreachableEngineMarksTheReplicaUnhealthy(t *testing.T) {
	e := newEnv(t)
	e.eng.handle(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"object":"chat.completion","usage":{"prompt_tokens":3,"completion_tokens":2}}`))
	})
	cfg := e.config()
	cfg.ScrapeEvery = time.Hour // only the first scrape runs
	cfg.HeartbeatEvery = 50 * time.Millisecond
	nextHB := heartbeats(t, e.nc, "r-1")
	e.start(cfg)
	waitHeartbeat(t, nextHB, func(hb subjects.Heartbeat) error {
		if !hb.ScrapeOK || hb.State != subjects.StateReady {
			return fmt.Errorf("state %q scrape_ok %v", hb.State, hb.ScrapeOK)
		}
		return nil
	})
	addr := e.eng.srv.Listener.Addr().String()
	e.eng.srv.Close() // the engine dies; nothing scrapes it for an hour
	start := time.Now()
	msgs := untilEnd(t, e.request("r-1", chatHeaders("req-dead"), `{"model":"x"}`))
	if st := msgs[len(msgs)-1].Header.Get(subjects.HdrStatus); st != "503" {
		t.Errorf("request to a dead engine answered %s, want 503", st)
	}
	waitHeartbeat(t, nextHB, func(hb subjects.Heartbeat) error {
		if hb.ScrapeOK {
			return fmt.Errorf("scrape_ok still true")
		}
		return nil
	})
	t.Logf("heartbeat with scrape_ok=false %v after the engine died, without a scrape", time.Since(start).Round(time.Millisecond))

	// The engine comes back on its address, as a restarted process does.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	back := httptest.NewUnstartedServer(e.eng.srv.Config.Handler)
	back.Listener = ln
	back.Start()
	t.Cleanup(back.Close)
	status := ""
	for _, m := range untilEnd(t, e.request("r-1", chatHeaders("req-back"), `{"model":"x"}`)) {
		status += m.Header.Get(subjects.HdrStatus)
	}
	if status != "200" {
		t.Fatalf("request to the engine back answered %q, want 200", status)
	}
	waitHeartbeat(t, nextHB, func(hb subjects.Heartbeat) error {
		if !hb.ScrapeOK {
			return fmt.Errorf("scrape_ok still false after the engine answered")
		}
		return nil
	})
}
