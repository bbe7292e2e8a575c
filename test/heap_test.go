package test

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/loadgen"
)

// TestHeapFlat sends SWITCHYARD_HEAP_REQUESTS (default 100,000) requests,
// each with a new conversation and a new prompt, through the in-process
// stack and checks that the live heap after the first 10% stays flat: the
// prefix map, the dispatch map, the quota and in-flight books are bounded
// and nothing is kept per request. It runs under `make bench-heap`.
func TestHeapFlat(t *testing.T) {
	if os.Getenv("SWITCHYARD_HEAP") == "" {
		t.Skip("set SWITCHYARD_HEAP=1 (make bench-heap) to run the 100,000-request heap check")
	}
	total := 100_000
	if v := os.Getenv("SWITCHYARD_HEAP_REQUESTS"); v != "" {
		total, _ = strconv.Atoi(v)
	}
	st := startStack(t, devstack.Config{Speed: 1000, Replicas: devstack.ReplicasNamed("l8-gen-0", "l8-gen-1")})
	client := loadgen.NewClient()
	url := st.GatewayURL() + "/v1/chat/completions"
	var sent, failed atomic.Int64
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	run := func(n int) {
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Go(func() {
				for i := w; i < n; i += 16 {
					k := sent.Add(1)
					body := fmt.Sprintf(`{"model":"chat-small","max_tokens":1,"messages":[{"role":"system","content":"%s"},{"role":"user","content":"request %d"}]}`,
						strings.Repeat(strconv.FormatInt(k, 36)+" ", 200), k)
					req, _ := http.NewRequest("POST", url, strings.NewReader(body))
					req.Header.Set("X-Conversation-Id", "conv-"+strconv.FormatInt(k, 10))
					resp, err := client.Do(req)
					if err != nil {
						failed.Add(1)
						continue
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						failed.Add(1)
					}
				}
			})
		}
		wg.Wait()
	}
	warm := total / 10
	run(warm)
	base := heap()
	t.Logf("after %d requests: heap in use %.1f MiB", warm, float64(base)/(1<<20))
	var last uint64
	for step := 1; step <= 3; step++ {
		run((total - warm) / 3)
		last = heap()
		t.Logf("after %d requests: heap in use %.1f MiB", sent.Load(), float64(last)/(1<<20))
	}
	if f := failed.Load(); f > 0 {
		t.Errorf("%d of %d requests failed", f, sent.Load())
	}
	// Flat: no more than 25% (and 16 MiB) above the warm heap.
	if limit := base + max(base/4, 16<<20); last > limit {
		t.Errorf("heap grew from %.1f MiB to %.1f MiB over %d requests", float64(base)/(1<<20), float64(last)/(1<<20), sent.Load())
	}
}
