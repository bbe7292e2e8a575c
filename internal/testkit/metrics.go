package testkit

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"testing"
	"time"

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
	fams, err := scrape(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// Remote gathers url's text exposition: Sum reads a part running in
// another process through it, and sums to NaN when the part does not
// answer (an engine killed on purpose).
func Remote(url string) prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		fams, err := scrape(context.Background(), url)
		return slices.Collect(maps.Values(fams)), err
	})
}

func scrape(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	fams, err := parse(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s: metrics do not parse: %w", url, err)
	}
	return fams, nil
}

// ParseMetrics parses a text exposition. Names are held to the classic
// rules (letters, digits, '_' and ':'), which every series here and vLLM's
// keep, so a name only newer servers accept fails the test.
func ParseMetrics(t testing.TB, r io.Reader) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := parse(r)
	if err != nil {
		t.Fatalf("metrics do not parse: %v", err)
	}
	return fams
}

func parse(r io.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	return p.TextToMetricFamilies(r)
}
