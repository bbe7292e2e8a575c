package testkit

import (
	"math"

	"github.com/prometheus/client_golang/prometheus"
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
