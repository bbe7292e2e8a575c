package test

import (
	"context"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/devstack"
)

// soakDuration is how long TestSoak runs: SWITCHYARD_SOAK (`make soak`
// sets 60s), else a short run that `make test` affords.
func soakDuration(t *testing.T) time.Duration {
	if v := os.Getenv("SWITCHYARD_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("SWITCHYARD_SOAK=%q: %v", v, err)
		}
		return d
	}
	if testing.Short() {
		t.Skip("soak skipped in -short mode")
	}
	return 6 * time.Second
}

// TestSoak runs mixed load (models, tenants, priorities, streamed or not,
// conversations) against the whole dev stack while engines are killed and
// restarted and adapters are stopped and started again. No request may be
// lost: every one ends complete (200) or with an explicit error; and since
// every request can be continued on another replica, none fails mid-answer.
func TestSoak(t *testing.T) {
	dur := soakDuration(t)
	st := startStack(t, devstack.Config{
		Speed: 4, ScrapeEvery: 250 * time.Millisecond, HeartbeatEvery: 250 * time.Millisecond,
		DrainGrace: 2 * time.Second,
	})
	url := st.GatewayURL()
	type kind struct{ model, key, priority string }
	kinds := []kind{
		{"chat-large", "", ""}, {"chat-large", "", ""}, {"chat-small", "", ""}, {"chat-small", "sk-teamx-dev", ""},
		{"code", "", ""}, {"auto", "", ""}, {"chat-large", "sk-acme-dev", ""}, {"chat-large", "", "batch"},
	}
	// Replicas with a sibling in their pool: killing one must cost only
	// the requests it had.
	victims := []string{"l70-gen-0", "l70-gen-1", "l8-gen-0", "l8-gen-1"}

	var (
		mu      sync.Mutex
		results []outcome
		faults  []string
		stop    = make(chan struct{})
		wg      sync.WaitGroup
	)
	for w := range 8 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := kinds[rng.IntN(len(kinds))]
				body := chatBody(k.model, 1+rng.IntN(64), rng.IntN(2) == 0)
				req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				if k.key != "" {
					req.Header.Set("Authorization", "Bearer "+k.key)
				}
				if k.priority != "" {
					req.Header.Set("X-Priority", k.priority)
				}
				if rng.IntN(3) == 0 {
					req.Header.Set("X-Conversation-Id", "soak-"+strconv.Itoa(rng.IntN(50)))
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				start := time.Now()
				var o outcome
				if resp, err := http.DefaultClient.Do(req.WithContext(ctx)); err != nil {
					o = outcome{err: err}
				} else {
					o = readAnswer(resp)
					resp.Body.Close()
				}
				o.took = time.Since(start)
				cancel()
				mu.Lock()
				results = append(results, o)
				mu.Unlock()
			}
		})
	}
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(99, 7))
		for cycle := 0; ; cycle++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
			}
			id := victims[rng.IntN(len(victims))]
			if cycle%2 == 0 {
				f := st.Faults(id)
				f.Kill()
				select {
				case <-stop:
				case <-time.After(time.Second):
				}
				if err := f.Restart(); err != nil {
					t.Errorf("restart %s: %v", id, err)
				}
				mu.Lock()
				faults = append(faults, "engine "+id+" killed and restarted")
				mu.Unlock()
			} else {
				if err := st.StopReplica(id); err != nil {
					t.Error(err)
				}
				if err := st.StartReplica(id); err != nil {
					t.Error(err)
				}
				mu.Lock()
				faults = append(faults, "adapter "+id+" stopped (SIGTERM) and started")
				mu.Unlock()
			}
		}
	})
	time.Sleep(dur)
	close(stop)
	wg.Wait()

	codes := map[string]int{}
	var ok, lost int
	var lat []time.Duration
	for _, o := range results {
		switch {
		case o.status == 200 && o.done:
			ok++
			lat = append(lat, o.took)
		case o.explicit():
			k := strconv.Itoa(o.status) + " " + o.code
			if codes[k] == 0 {
				t.Logf("first %s: %s", k, o.msg)
			}
			codes[k]++
		default:
			lost++
			if lost <= 10 {
				t.Errorf("lost: %v", o)
			}
		}
	}
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(int(p*float64(len(lat))), len(lat)-1)].Round(time.Millisecond)
	}
	var keys []string
	for k := range codes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var errs []string
	for _, k := range keys {
		errs = append(errs, k+"×"+strconv.Itoa(codes[k]))
	}
	t.Logf("soak %v: %d requests, %d ok (p50 %v, p99 %v), %d failed explicitly [%s], %d lost; %d faults injected",
		dur, len(results), ok, pct(0.5), pct(0.99), len(results)-ok-lost, strings.Join(errs, ", "), lost, len(faults))
	if lost > 0 {
		t.Errorf("%d requests lost (neither complete nor an explicit error)", lost)
	}
	// Every soak request can continue on another replica: an answer whose
	// replica failed mid-way is resumed, and none may fail for good.
	resumed := metric(st, "switchyard_gateway_resumes_total", map[string]string{"outcome": "completed"})
	failed := metric(st, "switchyard_gateway_resumes_total", map[string]string{"outcome": "failed"}) +
		metric(st, "switchyard_gateway_resumes_total", map[string]string{"outcome": "impossible"})
	t.Logf("answers whose replica failed mid-way: %v resumed, %v failed", resumed, failed)
	if failed > 0 {
		t.Errorf("%v answers failed mid-way for good; every one could continue on another replica", failed)
	}
	if ok == 0 {
		t.Error("no request succeeded")
	}
}
