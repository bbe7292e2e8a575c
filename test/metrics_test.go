package test

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/internal/testkit"
)

func TestMetricsEndpointHoldsEveryPartsSeries(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed("l8-gen-0", "l8-gen-1")})
	body := `{"model":"chat-small","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`
	if status, _ := post(t, st.GatewayURL(), "", body); status != 200 {
		t.Fatalf("status %d", status)
	}
	post(t, st.GatewayURL(), "", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`)
	mfs := testkit.Scrape(t, st.GatewayURL()+"/metrics")
	for _, want := range []struct {
		name string
		typ  dto.MetricType
	}{
		{"switchyard_gateway_requests_total", dto.MetricType_COUNTER},
		{"switchyard_gateway_time_to_first_byte_seconds", dto.MetricType_HISTOGRAM},
		{"switchyard_gateway_request_duration_seconds", dto.MetricType_HISTOGRAM},
		{"switchyard_gateway_retries_total", dto.MetricType_COUNTER},
		{"switchyard_gateway_stream_errors_total", dto.MetricType_COUNTER},
		{"switchyard_broker_decisions_total", dto.MetricType_COUNTER},
		{"switchyard_broker_rejections_total", dto.MetricType_COUNTER},
		{"switchyard_broker_decision_duration_seconds", dto.MetricType_HISTOGRAM},
		{"switchyard_broker_table_revision", dto.MetricType_GAUGE},
		{"switchyard_broker_table_age_seconds", dto.MetricType_GAUGE},
		{"switchyard_broker_heartbeat_age_seconds", dto.MetricType_GAUGE},
		{"switchyard_broker_replica_kv_usage_ratio", dto.MetricType_GAUGE},
		{"switchyard_adapter_engine_requests_total", dto.MetricType_COUNTER},
		{"switchyard_adapter_engine_errors_total", dto.MetricType_COUNTER},
		{"switchyard_adapter_scrape_failures_total", dto.MetricType_COUNTER},
		{"switchyard_adapter_inflight", dto.MetricType_GAUGE},
		{"switchyard_adapter_heartbeat_seq", dto.MetricType_GAUGE},
	} {
		mf, ok := mfs[want.name]
		if !ok {
			t.Errorf("missing %s", want.name)
			continue
		}
		if mf.GetType() != want.typ {
			t.Errorf("%s is %s, want %s", want.name, mf.GetType(), want.typ)
		}
	}
	// The request above shows with its route, status and model; the
	// rejection with its code.
	if v, ok := sampleValue(mfs["switchyard_gateway_requests_total"], map[string]string{"route": "/v1/chat/completions", "status": "200", "model": "chat-small"}); !ok || v != 1 {
		t.Errorf("gateway counted the one chat request %v times (found %v)", v, ok)
	}
	if !hasSample(mfs["switchyard_broker_rejections_total"], map[string]string{"code": "model_not_found"}) {
		t.Error("no rejection sample for the unknown model")
	}
	for name := range mfs {
		if strings.HasPrefix(name, "switchyard_") && strings.HasSuffix(name, "_total") && mfs[name].GetType() != dto.MetricType_COUNTER {
			t.Errorf("%s ends in _total but is not a counter", name)
		}
	}
}

func hasSample(mf *dto.MetricFamily, labels map[string]string) bool {
	_, ok := sampleValue(mf, labels)
	return ok
}

// sampleValue is the value of the first sample carrying labels.
func sampleValue(mf *dto.MetricFamily, labels map[string]string) (float64, bool) {
	if mf == nil {
		return 0, false
	}
	for _, m := range mf.GetMetric() {
		match := 0
		for _, l := range m.GetLabel() {
			if v, ok := labels[l.GetName()]; ok && v == l.GetValue() {
				match++
			}
		}
		if match == len(labels) {
			return m.GetCounter().GetValue() + m.GetGauge().GetValue(), true
		}
	}
	return 0, false
}

// TestDeployArtefactsNameRealSeries keeps the alert rules and the Grafana
// dashboard true to the series the parts export.
func TestDeployArtefactsNameRealSeries(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed("l8-gen-0"), ColdLoad: 200 * time.Millisecond})
	post(t, st.GatewayURL(), "", `{"model":"chat-small","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`)
	// A cold load, so that the loader's series exist.
	post(t, st.GatewayURL(), "", `{"model":"mixtral","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`)
	testkit.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		if metric(st, "switchyard_loader_loads_total", nil) != 1 {
			return errors.New("the cold load has not finished")
		}
		return nil
	})
	mfs := testkit.Scrape(t, st.GatewayURL()+"/metrics")
	root := repoRoot()
	re := regexp.MustCompile(`switchyard_[a-z_]+`)
	for _, f := range []string{"deploy/prometheus/switchyard-alerts.yml", "deploy/grafana/switchyard-dashboard.json"} {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		names := re.FindAllString(string(b), -1)
		if len(names) == 0 {
			t.Fatalf("%s names no series", f)
		}
		for _, n := range names {
			base := strings.TrimSuffix(n, "_bucket")
			if _, ok := mfs[base]; !ok {
				t.Errorf("%s uses %s, which no part exports", f, n)
			}
		}
	}
}
