package loadgen_test

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/loadgen"
)

// A trace replay never holds more than MaxInFlight requests open: requests
// due together wait for one to end (and say how late they were sent), and
// each result carries the usage its stream reported, cached tokens
// included where the answer gave them.
func TestRunTraceBoundsWhatIsOpenAndReadsUsage(t *testing.T) {
	var open, most atomic.Int64
	release, both := make(chan struct{}), make(chan struct{})
	var once sync.Once
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		n := open.Add(1)
		defer open.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		if n == 2 {
			once.Do(func() { close(both) })
		}
		<-release
		w.Header().Set("Content-Type", "text/event-stream")
		details := `, "prompt_tokens_details": {"cached_tokens": 30}`
		if r.Header.Get("X-No-Details") != "" {
			details = ""
		}
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"b\"}]}\n\n")
		// Spaced as Python's json.dumps writes it.
		fmt.Fprintf(w, "data: {\"choices\": [], \"usage\": {\"prompt_tokens\": 100, \"completion_tokens\": 2%s}}\n\n", details)
		fmt.Fprint(w, "data: [DONE]\n\n")
	})
	// The handler holds each request until released: none is before two
	// are open, then one at a time, so a third would show.
	go func() {
		<-both
		for range 6 {
			release <- struct{}{}
		}
	}()
	reqs := make([]loadgen.TraceRequest, 6)
	for i := range reqs {
		reqs[i] = loadgen.TraceRequest{Body: func() []byte { return []byte(`{"stream":true}`) }}
	}
	rs, err := loadgen.RunTrace(t.Context(), loadgen.TraceConfig{Target: srv.URL, MaxInFlight: 2, Timeout: 10 * time.Second}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if m := most.Load(); m != 2 {
		t.Errorf("%d requests open at once, want the bound 2", m)
	}
	late := 0
	for i, r := range rs {
		if r.Failed != "" || !r.Usage || !r.CachedReported || r.Prompt != 100 || r.Cached != 30 || r.Completion != 2 {
			t.Errorf("request %d: %+v", i, r)
		}
		if len(r.Gaps) != 1 {
			t.Errorf("request %d: %d token gaps, want 1 (the usage chunk is no token)", i, len(r.Gaps))
		}
		if r.Late > 0 {
			late++
		}
	}
	if late < 4 {
		t.Errorf("%d requests sent late, want the 4 beyond the bound", late)
	}
}
