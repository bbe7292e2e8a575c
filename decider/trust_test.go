package decider

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/switchyard-llm/switchyard/features"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// TestTrust checks what the broker refuses to believe of a message
// (docs/security.md, "What each part checks").
func TestTrust(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	b := newTestBroker(t, 4, now)
	chat := func(content string) []byte {
		b, _ := json.Marshal(map[string]any{"model": "chat-large", "max_tokens": 5,
			"messages": []map[string]string{{"role": "user", "content": content}}})
		return b
	}

	t.Run("a direct client's feature headers are not believed", func(t *testing.T) {
		var msg nats.Msg
		h := nats.Header{}
		h.Set(subjects.HdrPromptTokens, "1")
		h.Set(subjects.HdrMaxTokens, "1")
		h.Set(subjects.HdrFeatures, "code")
		h.Set(subjects.HdrColdWaited, "1")
		s := NewScratch()
		long := strings.Repeat("the quick brown fox jumps over the lazy dog ", 2000) // 88 KB
		if !handleInto(b, s, "llm.route.default", "_INBOX.x", h, chat(long), &msg) {
			t.Fatalf("not forwarded: %v %s", msg.Header, msg.Data)
		}
		if s.req.PromptTokens < 16000 || s.req.ColdWaited || len(s.req.Features) > 0 {
			t.Errorf("took the headers: prompt %d, cold-waited %v, features %v", s.req.PromptTokens, s.req.ColdWaited, s.req.Features)
		}
		// The test table has no long-context replica: the pool wanted shows
		// as the fallback from it.
		if got := msg.Header.Get(subjects.HdrRouteReason); !strings.Contains(got, "pool-fallback-general") {
			t.Errorf("an 88 KB prompt claiming 1 token was not routed as long context: reason %q", got)
		}
		if got := msg.Header.Get(subjects.HdrMaxTokens); got != "5" {
			t.Errorf("Llm-Max-Tokens forwarded %q, want the body's 5", got)
		}
	})

	t.Run("a direct client's headers are not believed on Responses and Messages either", func(t *testing.T) {
		// One replica whose engine serves every endpoint, for this case alone.
		old := b.Table()
		t.Cleanup(func() { b.SetTable(old) })
		next := old.Clone()
		v, err := table.Decode("replicas.r-all", []byte(`{"model":"llama-3-70b-instruct","version":"v1.5.0","pool":"general",`+
			`"max_batch":32,"max_queue":128,"state":"ready","endpoints":["`+strings.Join(subjects.AllEndpoints(), `","`)+`"]}`))
		if err != nil {
			t.Fatal(err)
		}
		next.Set(v, nil)
		b.SetTable(next)
		b.router.ObserveHeartbeat(&subjects.Heartbeat{Replica: "r-all", Model: "llama-3-70b-instruct", Version: "v1.5.0", Pool: "general",
			State: subjects.StateReady, MaxBatch: 32, MaxQueue: 128, ScrapeOK: true, Endpoints: subjects.AllEndpoints()}, now)
		long := strings.Repeat("the quick brown fox jumps over the lazy dog ", 2000) // 88 KB
		for _, tc := range []struct {
			endpoint string
			body     map[string]any
		}{
			{subjects.EndpointResponses, map[string]any{"model": "chat-large", "max_output_tokens": 5, "input": long}},
			{subjects.EndpointResponses, map[string]any{"model": "chat-large", "max_output_tokens": 5, "input": "hi", "instructions": long}},
			{subjects.EndpointMessages, map[string]any{"model": "chat-large", "max_tokens": 5,
				"messages": []map[string]string{{"role": "user", "content": long}}}},
			{subjects.EndpointMessages, map[string]any{"model": "chat-large", "max_tokens": 5, "system": long,
				"messages": []map[string]string{{"role": "user", "content": "hi"}}}},
		} {
			body, _ := json.Marshal(tc.body)
			var msg nats.Msg
			h := nats.Header{}
			h.Set(subjects.HdrEndpoint, tc.endpoint)
			h.Set(subjects.HdrPromptTokens, "1")
			h.Set(subjects.HdrMaxTokens, "1")
			s := NewScratch()
			if !handleInto(b, s, "llm.route.default", "_INBOX.x", h, body, &msg) {
				t.Fatalf("%s: not forwarded: %v %s", tc.endpoint, msg.Header, msg.Data)
			}
			if s.req.PromptTokens < 16000 {
				t.Errorf("%s: took the header: prompt %d", tc.endpoint, s.req.PromptTokens)
			}
			if got := msg.Header.Get(subjects.HdrMaxTokens); got != "5" {
				t.Errorf("%s: Llm-Max-Tokens forwarded %q, want the body's 5", tc.endpoint, got)
			}
		}
		for _, tc := range []struct{ endpoint, body string }{
			{subjects.EndpointResponses, `{"model":"chat-large","input":"hi","max_output_tokens":2000000}`},
			{subjects.EndpointMessages, `{"model":"chat-large","max_tokens":-1,"messages":[{"role":"user","content":"hi"}]}`},
			{subjects.EndpointMessages, `{"model":"chat-large","n":4,"messages":[{"role":"user","content":"hi"}]}`},
		} {
			var msg nats.Msg
			h := nats.Header{subjects.HdrEndpoint: {tc.endpoint}}
			handleInto(b, NewScratch(), "llm.route.default", "_INBOX.x", h, []byte(tc.body), &msg)
			if msg.Header.Get(subjects.HdrStatus) != "400" {
				t.Errorf("%s %s: %v %s, want 400", tc.endpoint, tc.body, msg.Header, msg.Data)
			}
		}
	})

	t.Run("a direct client continues only a stored response its body names and its tenant owns", func(t *testing.T) {
		// No response is stored: whatever names one is a 404, and a
		// header cannot vouch for a body naming another tenant's.
		for _, tc := range []struct{ header, body string }{
			{"", `{"model":"chat-large","input":"hi","previous_response_id":"resp_other"}`},
			{"resp_mine", `{"model":"chat-large","input":"hi","previous_response_id":"resp_other"}`},
		} {
			var msg nats.Msg
			h := nats.Header{subjects.HdrEndpoint: {subjects.EndpointResponses}}
			if tc.header != "" {
				h.Set(subjects.HdrPreviousResponse, tc.header)
			}
			handleInto(b, NewScratch(), "llm.route.default", "_INBOX.x", h, []byte(tc.body), &msg)
			if msg.Header.Get(subjects.HdrStatus) != "404" || !strings.Contains(string(msg.Data), "resp_other") {
				t.Errorf("header %q: %v %s, want 404 naming the body's resp_other", tc.header, msg.Header, msg.Data)
			}
		}
	})

	t.Run("a gateway's feature headers are", func(t *testing.T) {
		var msg nats.Msg
		h := nats.Header{}
		h.Set(subjects.HdrModel, "chat-large")
		h.Set(subjects.HdrPromptTokens, "20000")
		h.Set(subjects.HdrMaxTokens, "7")
		if !handleInto(b, NewScratch(), "llm.gw.default", "llm.reply.gw.1", h, chat("hi"), &msg) {
			t.Fatalf("not forwarded: %v %s", msg.Header, msg.Data)
		}
		if !strings.Contains(msg.Header.Get(subjects.HdrRouteReason), "pool-fallback-general") || msg.Header.Get(subjects.HdrMaxTokens) != "7" {
			t.Errorf("gateway headers not taken: %v", msg.Header)
		}
	})

	t.Run("a gateway's prefix at the most blocks is within the bounds", func(t *testing.T) {
		var msg nats.Msg
		blocks := make([]uint64, features.MaxPrefixBlocks)
		for i := range blocks {
			blocks[i] = ^uint64(i)
		}
		h := nats.Header{subjects.HdrModel: {"chat-large"}, subjects.HdrPromptTokens: {"10"},
			subjects.HdrPrefix: {features.FormatPrefixHeader(blocks)}}
		if !handleInto(b, NewScratch(), "llm.gw.default", "llm.reply.gw.1", h, chat("hi"), &msg) {
			t.Fatalf("a %d-block prefix refused: %v %s", len(blocks), msg.Header, msg.Data)
		}
	})

	t.Run("the default max_tokens reserved travels with the request", func(t *testing.T) {
		var msg nats.Msg
		body := []byte(`{"model":"chat-large","messages":[{"role":"user","content":"hi"}]}`)
		if !handleInto(b, NewScratch(), "llm.route.default", "_INBOX.x", nats.Header{}, body, &msg) {
			t.Fatalf("not forwarded: %s", msg.Data)
		}
		if got := msg.Header.Get(subjects.HdrMaxTokens); got != "1024" {
			t.Errorf("Llm-Max-Tokens %q, want the model's default 1024", got)
		}
	})

	t.Run("a header over its bound is a 400 without work in proportion", func(t *testing.T) {
		huge := strings.Repeat("r-0,", 6<<20/4) // 6 MB
		for _, tc := range []struct{ header, value string }{
			{subjects.HdrExclude, huge},
			{subjects.HdrExclude, strings.Repeat("r,", subjects.MaxExclude)},
			{subjects.HdrAvoid, huge},
			{subjects.HdrAvoid, strings.Repeat("r,", subjects.MaxAvoid)},
			{subjects.HdrModel, strings.Repeat("m", 2<<20)},
			{subjects.HdrModel, strings.Repeat("m", subjects.MaxModelChars+1)},
			{subjects.HdrFeatures, strings.Repeat("code,", 100)},
			{subjects.HdrPrefix, strings.Repeat("0123456789abcdef,", 100000)},
		} {
			best := time.Hour
			for range 3 {
				var msg nats.Msg
				s := NewScratch()
				h := nats.Header{tc.header: {tc.value}}
				start := time.Now()
				handleInto(b, s, "llm.gw.default", "llm.reply.gw.1", h, chat("hi"), &msg)
				best = min(best, time.Since(start))
				if msg.Header.Get(subjects.HdrStatus) != "400" {
					t.Fatalf("%s of %d bytes: %v %s", tc.header, len(tc.value), msg.Header, msg.Data)
				}
				// Refused before any work in proportion: nothing was split.
				if len(s.exclude)+len(s.avoid)+len(s.features)+len(s.prefix) > 0 || s.req.Model != "" {
					t.Fatalf("%s of %d bytes was read before it was refused: %d excluded, %d features, %d prefix blocks, model %d chars",
						tc.header, len(tc.value), len(s.exclude), len(s.features), len(s.prefix), len(s.req.Model))
				}
			}
			// The bound is about time, and generous: refusing is
			// microseconds (BenchmarkRefuseOverBound, docs/benchmarks.md)
			// where splitting 6 MB took over a second.
			if best > 100*time.Millisecond {
				t.Errorf("%s of %d bytes took %v to refuse", tc.header, len(tc.value), best)
			}
		}
		var msg nats.Msg
		big := strings.Repeat("x", subjects.MaxModelChars+1)
		handleInto(b, NewScratch(), "llm.route.default", "_INBOX.x", nats.Header{}, []byte(`{"model":"`+big+`","messages":[]}`), &msg)
		if msg.Header.Get(subjects.HdrStatus) != "400" {
			t.Errorf("a %d-character model in the body: %v", len(big), msg.Header)
		}
	})

	t.Run("heartbeats out of range or of unknown replicas are ignored", func(t *testing.T) {
		before := b.router.Known()
		for _, hb := range []string{
			`{"replica":"r-1","state":"ready","scrape_ok":true,"kv_usage":-1e300}`,
			`{"replica":"r-1","state":"ready","scrape_ok":true,"kv_usage":1.5}`,
			`{"replica":"r-1","state":"ready","scrape_ok":true,"running":-4}`,
			`{"replica":"r-1","state":"ready","scrape_ok":true,"waiting":999999999}`,
			`{"replica":"r-1","state":"ready","scrape_ok":true,"engine_failures":1000000000}`,
			`{"replica":"r-1","state":"ready","scrape_ok":true,"ttft_ewma_ms":-1}`,
			`{"replica":"r-1","state":"ready","scrape_ok":true,"prefill_tps":-5}`,
			`{"replica":"r-1","state":"ready","scrape_ok":true,"prefill_tps":1e300}`,
			`{"replica":"r-1","state":"ready","scrape_ok":true,"queued_prefill_tokens":-1}`,
			`{"replica":"r-1","state":"ready","scrape_ok":true,"queued_prefill_tokens":4000000000}`,
			`{"replica":"r-1","state":"ready","scrape_ok":true,"decode_ms":-1}`,
			`{"replica":"r-1","state":"ready","scrape_ok":true,"decode_ms":1e300}`,
			`{"replica":"r-1","state":"ready","scrape_ok":true,"batch_waiting":-1}`,
			`{"replica":"r-1","state":"ready","scrape_ok":true,"batch_waiting":1000000000}`,
			`{"replica":"r-1","state":"ready","scrape_ok":true,"region":"eu.west"}`,
			`{"replica":"r-1","state":"ready","scrape_ok":true,"region":"` + strings.Repeat("r", 65) + `"}`,
		} {
			if _, err := DecodeHeartbeat("llm.heartbeat.r-1", []byte(hb), new(subjects.Heartbeat)); err == nil {
				t.Errorf("taken: %s", hb)
			}
		}
		var hb subjects.Heartbeat
		if _, err := DecodeHeartbeat("llm.heartbeat.r-1", []byte(`{"replica":"r-1","state":"ready","scrape_ok":true,"region":"eu-west"}`), &hb); err != nil || hb.Region != "eu-west" {
			t.Errorf("a heartbeat with region eu-west: %v, region %q", err, hb.Region)
		}
		for i := range 100 {
			id := "ghost-" + strconv.Itoa(i)
			b.onHeartbeat(&nats.Msg{Subject: "llm.heartbeat." + id, Data: []byte(`{"replica":"` + id + `","state":"ready","scrape_ok":true}`)})
		}
		if got := b.router.Known(); got != before {
			t.Errorf("heartbeats of unregistered replicas grew the load view from %d to %d", before, got)
		}
		if n := series(b.metrics.heartbeatAge); n > before {
			t.Errorf("%d heartbeat-age series for %d registered replicas", n, before)
		}
		if got := testutil.ToFloat64(b.metrics.refused.WithLabelValues(refusedReplica)); got != 100 {
			t.Errorf("refused unknown-replica heartbeats counted %v, want 100", got)
		}
	})

	t.Run("a replica deleted from the table takes its series with it", func(t *testing.T) {
		b.onHeartbeat(&nats.Msg{Subject: "llm.heartbeat.r-3", Data: []byte(`{"replica":"r-3","state":"ready","scrape_ok":true,"kv_usage":0.2}`)})
		has := func() bool {
			ch := make(chan prometheus.Metric, 1<<12)
			b.metrics.replicaKV.Collect(ch)
			close(ch)
			for m := range ch {
				if strings.Contains(m.Desc().String(), "replica") && strings.Contains(metricText(m), `"r-3"`) {
					return true
				}
			}
			return false
		}
		if !has() {
			t.Fatal("no kv series for the registered r-3")
		}
		next := b.Table().Clone()
		next.Delete("replicas.r-3")
		b.SetTable(next)
		if has() {
			t.Error("r-3 deleted from the table, its kv series is still exported")
		}
	})

	t.Run("usage without a reservation is dropped and counted", func(t *testing.T) {
		// Only a tenant with a token quota has reservations to settle.
		old := b.Table()
		t.Cleanup(func() { b.SetTable(old) })
		next := old.Clone()
		v, err := table.Decode("tenants.trial", []byte(`{"tier":"standard","quota":{"tpm":3000}}`))
		if err != nil {
			t.Fatal(err)
		}
		next.Set(v, nil)
		b.SetTable(next)
		before := testutil.ToFloat64(b.metrics.refused.WithLabelValues(refusedUsage))
		b.onUsage(&nats.Msg{Subject: "llm.usage.trial", Data: []byte(`{"tenant":"trial","reserved_tokens":1000000000}`)})
		b.onUsage(&nats.Msg{Subject: "llm.usage.trial", Data: []byte(`{"tenant":"trial","request_id":"nobody","reserved_tokens":1000000000}`)})
		if got := testutil.ToFloat64(b.metrics.refused.WithLabelValues(refusedUsage)) - before; got != 2 {
			t.Errorf("counted %v forged usage events, want 2", got)
		}
		// An unmetered tenant's usage had nothing reserved: not a lie.
		b.onUsage(&nats.Msg{Subject: "llm.usage.acme", Data: []byte(`{"tenant":"acme","request_id":"r-1","completion_tokens":5}`)})
		if got := testutil.ToFloat64(b.metrics.refused.WithLabelValues(refusedUsage)) - before; got != 2 {
			t.Errorf("usage of a tenant without a token quota counted as refused (%v)", got-2)
		}
	})

	t.Run("presence is bounded", func(t *testing.T) {
		for i := range 2 * maxBrokers {
			b.onPresence(&nats.Msg{Data: []byte("b-" + strconv.Itoa(i))})
		}
		b.onPresence(&nats.Msg{Data: []byte("not a token")})
		if n := b.LiveBrokers(); n > maxBrokers+1 {
			t.Errorf("%d live brokers counted", n)
		}
	})
}

// metricText is a metric's labels as text.
func metricText(m prometheus.Metric) string {
	var d dto.Metric
	_ = m.Write(&d)
	return d.String()
}

// series counts the series a collector exports.
func series(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric, 1<<12)
	c.Collect(ch)
	close(ch)
	return len(ch)
}
