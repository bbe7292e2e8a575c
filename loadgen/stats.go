package loadgen

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"time"
)

// Dur is a duration that reads as milliseconds in JSON (1.234 = 1234µs).
type Dur time.Duration

// MarshalJSON writes milliseconds with microsecond precision.
func (d Dur) MarshalJSON() ([]byte, error) {
	return strconv.AppendFloat(nil, float64(time.Duration(d).Round(time.Microsecond)/time.Microsecond)/1000, 'f', -1, 64), nil
}

// UnmarshalJSON reads milliseconds.
func (d *Dur) UnmarshalJSON(b []byte) error {
	var ms float64
	if err := json.Unmarshal(b, &ms); err != nil {
		return err
	}
	*d = Dur(math.Round(ms * float64(time.Millisecond)))
	return nil
}

// D is d as a time.Duration.
func (d Dur) D() time.Duration { return time.Duration(d) }

// Ms is d in milliseconds.
func (d Dur) Ms() float64 { return float64(d) / float64(time.Millisecond) }

// Summary is the distribution of one measurement over a run.
type Summary struct {
	N    int `json:"n"`
	Mean Dur `json:"mean_ms"`
	Min  Dur `json:"min_ms"`
	P50  Dur `json:"p50_ms"`
	P90  Dur `json:"p90_ms"`
	P99  Dur `json:"p99_ms"`
	P999 Dur `json:"p999_ms"`
	Max  Dur `json:"max_ms"`
}

// Percentile is the nearest-rank percentile p (0–100) of sorted samples:
// the smallest sample with at least p% of the samples at or below it. It
// never interpolates, so every value it returns was measured.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	switch {
	case n == 0:
		return 0
	case p <= 0:
		return sorted[0]
	case p >= 100:
		return sorted[n-1]
	}
	// The epsilon keeps 99% of 100 samples at rank 99 despite p·n/100
	// landing a hair above it in floating point.
	rank := int(math.Ceil(p*float64(n)/100 - 1e-9))
	return sorted[min(max(rank, 1), n)-1]
}

// Summarize sorts samples in place and summarizes them.
func Summarize(samples []time.Duration) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	slices.Sort(samples)
	var sum time.Duration
	for _, s := range samples {
		sum += s
	}
	return Summary{
		N:    len(samples),
		Mean: Dur(sum / time.Duration(len(samples))),
		Min:  Dur(samples[0]),
		P50:  Dur(Percentile(samples, 50)),
		P90:  Dur(Percentile(samples, 90)),
		P99:  Dur(Percentile(samples, 99)),
		P999: Dur(Percentile(samples, 99.9)),
		Max:  Dur(samples[len(samples)-1]),
	}
}
