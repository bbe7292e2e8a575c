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
// connect to the engine is answered 503 (retryable elsewhere) and a
// heartbeat saying scrape_ok=false goes at once, long before the scraper
// would have noticed. When the engine is back, its first answer to a
// request ends the mark, with a heartbeat at once again. Scrapes and
// periodic heartbeats are an hour apart, so only the heartbeats sent at
// once can pass: the one sent at start has no engine failure or success.
func TestUnreachableEngineMarksTheReplicaUnhealthy(t *testing.T) {
	e := newEnv(t)
	e.eng.handle(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"object":"chat.completion","usage":{"prompt_tokens":3,"completion_tokens":2}}`))
	})
	cfg := e.config()
	cfg.ScrapeEvery = time.Hour // only the first scrape runs
	cfg.HeartbeatEvery = time.Hour
	nextHB := heartbeats(t, e.nc, "r-1")
	e.start(cfg)
	e.waitReady("r-1")
	addr := e.eng.srv.Listener.Addr().String()
	e.eng.srv.Close() // the engine dies; nothing scrapes it for an hour
	start := time.Now()
	msgs := untilEnd(t, e.request("r-1", chatHeaders("req-dead"), `{"model":"x"}`))
	if st := msgs[len(msgs)-1].Header.Get(subjects.HdrStatus); st != "503" {
		t.Errorf("request to a dead engine answered %s, want 503", st)
	}
	waitHeartbeat(t, nextHB, func(hb subjects.Heartbeat) error {
		if hb.ScrapeOK || hb.EngineFailures != 1 {
			return fmt.Errorf("scrape_ok %v with %d engine failures", hb.ScrapeOK, hb.EngineFailures)
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
		if !hb.ScrapeOK || hb.EngineSuccesses != 1 {
			return fmt.Errorf("scrape_ok %v with %d engine successes after the engine answered", hb.ScrapeOK, hb.EngineSuccesses)
		}
		return nil
	})
}
