package lab

import (
	"math"
	"strconv"

	"gonum.org/v1/plot"
)

// logTicks labels 1, 2 and 5 times each power of ten (and marks the other
// integers of each decade), so a log axis reads without counting
// gridlines.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	if lo <= 0 || hi <= lo {
		return nil
	}
	var out []plot.Tick
	labelled := 0
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		p := math.Pow(10, e)
		for m := 1.0; m < 10; m++ {
			v := m * p
			if v < lo*(1-1e-9) || v > hi*(1+1e-9) {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || m == 2 || m == 5 {
				t.Label = label(v)
				labelled++
			}
			out = append(out, t)
		}
	}
	if labelled < 4 { // a narrow range: label every integer of the decade
		for i := range out {
			out[i].Label = label(out[i].Value)
		}
	}
	return out
}

// linTicks puts about seven labelled ticks at a round step.
type linTicks struct{}

func (linTicks) Ticks(lo, hi float64) []plot.Tick {
	if hi <= lo {
		return plot.DefaultTicks{}.Ticks(lo, hi)
	}
	raw := (hi - lo) / 7
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	step := p
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= raw {
			step = m * p
			break
		}
	}
	// Decimals enough to tell the ticks apart, and no binary noise.
	dec := max(0, int(-math.Floor(math.Log10(step)+1e-9)))
	if step*math.Pow(10, float64(dec)) != math.Round(step*math.Pow(10, float64(dec))) {
		dec++
	}
	var out []plot.Tick
	for k := math.Ceil(lo / step); k*step <= hi+step*1e-9; k++ {
		v := k * step
		if math.Abs(v) < step*1e-9 {
			v = 0 // not "-0"
		}
		out = append(out, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', dec, 64)})
		if half := v + step/2; half <= hi {
			out = append(out, plot.Tick{Value: half})
		}
	}
	return out
}

func label(v float64) string {
	if math.Abs(v) < 1e-12 {
		return "0"
	}
	if math.Abs(v) >= 1 {
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}
