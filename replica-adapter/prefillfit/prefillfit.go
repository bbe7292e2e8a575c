// Package prefillfit learns an engine's prefill rate from the first tokens
// of requests whose uncached prompt tokens are known: each is a point
// (uncached tokens, time to first token in ms), and the rate is the slope
// of the least-squares line through the recent points. The line's
// intercept (the engine's base TTFT, and waiting for a step in progress)
// does not bias the slope, where timing a first token from the fastest one
// seen does: that one is itself a prefill. The replica adapter learns the
// rate it heartbeats this way, and the lab's model of the adapter with it.
package prefillfit

import "github.com/switchyard-llm/switchyard/subjects"

const (
	// alpha is the weight of one point in the line's moving moments.
	alpha = 0.05
	// MinPoints is how many points the line needs, and minSpread the
	// spread of uncached tokens (standard deviation) below which the
	// points are all one size and say nothing about a slope.
	MinPoints = 8
	minSpread = 256
	// minR2 is the least share of the TTFTs' variance the line must
	// explain (a correlation of 0.5): points that barely follow their
	// uncached tokens (a stalled first token among them, an engine
	// whose counts mean something else) give a slope that is noise, at
	// worst a rate near the bound that makes the replica look free.
	minR2 = 0.25
	// staleAfter is how many points in a row may fit no line before the
	// last rate they gave is dropped: the engine's speed may have moved
	// while its traffic stopped saying so (all one size, say).
	staleAfter = 100
	// outlier is how many times the line's TTFT a point may take: a first
	// token stalled far beyond it says nothing about prefill, and in the
	// moments it would hold the line off for hundreds of points.
	outlier = 4
)

// Fit is the least-squares line through recent points: the exponentially
// weighted moments of both coordinates. The zero Fit has no points.
type Fit struct {
	n                     int
	mx, my, mxx, mxy, myy float64
	rate                  float64
	misses                int // points in a row since the last that fit a line
}

// Add takes one point: x uncached tokens took y ms to a first token. The
// rate follows the line while the points fit one (enough of them, spread
// over sizes, with a positive slope that explains minR2 of the TTFTs'
// variance); while they do not, the last rate they gave stands, for
// staleAfter points. A point more than outlier times the line's TTFT is
// left out.
func (f *Fit) Add(x, y float64) {
	if f.rate > 0 {
		if line := f.my + (x-f.mx)*1000/f.rate; line > 0 && y > outlier*line {
			f.miss()
			return
		}
	}
	if f.n == 0 {
		f.mx, f.my, f.mxx, f.mxy, f.myy = x, y, x*x, x*y, y*y
	} else {
		f.mx += alpha * (x - f.mx)
		f.my += alpha * (y - f.my)
		f.mxx += alpha * (x*x - f.mxx)
		f.mxy += alpha * (x*y - f.mxy)
		f.myy += alpha * (y*y - f.myy)
	}
	f.n++
	vx, vy, cxy := f.mxx-f.mx*f.mx, f.myy-f.my*f.my, f.mxy-f.mx*f.my
	if f.n < MinPoints || vx < minSpread*minSpread || vy <= 0 || cxy <= 0 || cxy*cxy < minR2*vx*vy {
		f.miss()
		return
	}
	f.rate, f.misses = min(vx/cxy*1000, subjects.MaxPrefillTokensPerSec), 0
}

// miss counts a point that fit no line, and drops the last rate after
// staleAfter of them in a row.
func (f *Fit) miss() {
	if f.misses++; f.misses >= staleAfter {
		f.rate = 0
	}
}

// Rate is the slope as a prefill rate, uncached tokens per second, bounded
// to what a heartbeat may carry; 0 until the points have fit a line, and
// once staleAfter points in a row have fit none.
func (f *Fit) Rate() float64 { return f.rate }

// Points is how many points the line has taken.
func (f *Fit) Points() int { return f.n }
