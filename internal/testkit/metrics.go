package testkit

import (
	"io"
	"math"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Sum is the value of a counter or gauge family in g, summed over the
// series whose labels include every pair of want (nil: all of them); a
// family not gathered yet sums to 0, and a failed gathering to NaN, which
// no test wants. A single series of a collector the
// test holds is read with prometheus/testutil.ToFloat64 instead.
func Sum(g prometheus.Gatherer, name string, want map[string]string) float64 {
	mfs, err := g.Gather()
	if err != nil {
		return math.NaN()
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for k, v := range want {
				found := false
				for _, l := range m.GetLabel() {
					found = found || (l.GetName() == k && l.GetValue() == v)
				}
				if !found {
					continue series
				}
			}
			if c := m.GetCounter(); c != nil {
				sum += c.GetValue()
			} else {
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// Scrape reads url's Prometheus text exposition as Prometheus does, and
// fails the test when it cannot be fetched or does not parse.
func Scrape(t testing.TB, url string) map[string]*dto.MetricFamily {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	return ParseMetrics(t, resp.Body)
}

// ParseMetrics parses a text exposition. Names are held to the classic
// rules (letters, digits, '_' and ':'), which every series here and vLLM's
// keep, so a name only newer servers accept fails the test.
func ParseMetrics(t testing.TB, r io.Reader) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		t.Fatalf("metrics do not parse: %v", err)
	}
	return fams
}
