package lab

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Chart size: 800×500 pixels at the PNG canvas's 96 dpi.
const (
	chartW = 800 * vg.Inch / 96
	chartH = 500 * vg.Inch / 96
)

// Series is one line of a chart.
type Series struct {
	Name string
	X, Y []float64
	// Wide draws a thick, pale line under the others, for a reference
	// that another series may coincide with.
	Wide bool
	// NoMarks draws the line without point markers (dense series).
	NoMarks bool
}

// Chart is a line chart (or, with Bars, a grouped bar chart) to be saved
// as a PNG beside report.md.
type Chart struct {
	File   string // file name, e.g. "threshold-p99.png"
	Title  string
	XLabel string
	YLabel string
	Series []Series
	LogX   bool
	LogY   bool
	// YMin and YMax, when YMax > YMin, fix the Y range.
	YMin, YMax float64
	// Bars draws a grouped bar chart: one group per Categories entry, one
	// bar per series (Series[i].Y[j] is series i in category j).
	Bars       bool
	Categories []string
	// Legend placement: top-left by default; LegendRight moves it right,
	// LegendBottom down.
	LegendRight, LegendBottom bool
	// Marks are vertical reference lines at these X values.
	Marks []float64
}

// seriesColor is the i-th color of a colorblind-friendly-ish palette.
func seriesColor(i int) color.RGBA {
	switch i % 8 {
	case 0:
		return color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff} // blue
	case 1:
		return color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff} // red
	case 2:
		return color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff} // green
	case 3:
		return color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff} // orange
	case 4:
		return color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff} // purple
	case 5:
		return color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff} // brown
	case 6:
		return color.RGBA{R: 0xe3, G: 0x77, B: 0xc2, A: 0xff} // pink
	}
	return color.RGBA{R: 0x17, G: 0xbe, B: 0xcf, A: 0xff} // teal
}

// Save renders the chart into dir.
func (c *Chart) Save(dir string) error {
	p := plot.New()
	p.Title.Text = c.Title
	p.Title.TextStyle.Font.Size = vg.Points(14)
	p.X.Label.Text, p.Y.Label.Text = c.XLabel, c.YLabel
	p.X.Label.TextStyle.Font.Size = vg.Points(12)
	p.Y.Label.TextStyle.Font.Size = vg.Points(12)
	p.X.Tick.Label.Font.Size = vg.Points(11)
	p.Y.Tick.Label.Font.Size = vg.Points(11)
	p.Legend.TextStyle.Font.Size = vg.Points(11)
	p.Legend.Top = !c.LegendBottom
	p.Legend.Left = !c.LegendRight
	p.Legend.XOffs, p.Legend.YOffs = vg.Points(6), vg.Points(-6)
	if c.LegendBottom {
		p.Legend.YOffs = vg.Points(6)
	}
	if c.LegendRight {
		p.Legend.XOffs = vg.Points(-6)
	}
	p.Legend.ThumbnailWidth = vg.Points(28)
	grid := plotter.NewGrid()
	grid.Vertical.Color = color.Gray{Y: 0xdd}
	grid.Horizontal.Color = color.Gray{Y: 0xdd}
	p.Add(grid)
	var err error
	if c.Bars {
		err = c.bars(p)
	} else {
		err = c.lines(p)
	}
	if err != nil {
		return fmt.Errorf("chart %s: %w", c.File, err)
	}
	if !c.Bars { // room around the outermost points, so their ticks show
		if c.LogX {
			p.X.Min, p.X.Max = p.X.Min/1.08, p.X.Max*1.08
		} else {
			pad := 0.03 * (p.X.Max - p.X.Min)
			p.X.Min, p.X.Max = p.X.Min-pad, p.X.Max+pad
		}
	}
	switch {
	case c.YMax > c.YMin:
		p.Y.Min, p.Y.Max = c.YMin, c.YMax
	case c.Bars:
	case c.LogY:
		p.Y.Min, p.Y.Max = p.Y.Min/1.4, p.Y.Max*2 // headroom for the legend
	default:
		p.Y.Max += 0.15 * (p.Y.Max - p.Y.Min)
	}
	for _, x := range c.Marks {
		l, err := plotter.NewLine(plotter.XYs{{X: x, Y: p.Y.Min}, {X: x, Y: p.Y.Max}})
		if err != nil {
			return err
		}
		l.Color, l.Dashes, l.Width = color.Gray{Y: 0x88}, []vg.Length{vg.Points(2), vg.Points(3)}, vg.Points(1)
		p.Add(l)
	}
	return p.Save(chartW, chartH, filepath.Join(dir, c.File))
}

func (c *Chart) lines(p *plot.Plot) error {
	p.X.Tick.Marker, p.Y.Tick.Marker = linTicks{}, linTicks{}
	if c.LogX {
		p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, logTicks{}
	}
	if c.LogY {
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, logTicks{}
	}
	for i, s := range c.Series {
		var pts plotter.XYs
		for k := range s.X {
			x, y := s.X[k], s.Y[k]
			if math.IsNaN(y) || math.IsInf(y, 0) || c.LogY && y <= 0 || c.LogX && x <= 0 {
				continue
			}
			pts = append(pts, plotter.XY{X: x, Y: y})
		}
		if len(pts) == 0 {
			continue
		}
		l, sc, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		col := seriesColor(i)
		l.Color, l.Width, l.Dashes = col, vg.Points(2), plotutil.Dashes(i)
		sc.Color, sc.Shape, sc.Radius = col, plotutil.Shape(i), vg.Points(3.5)
		if s.Wide {
			l.Color = color.NRGBA{R: col.R, G: col.G, B: col.B, A: 0x70}
			l.Width, l.Dashes = vg.Points(7), nil
		}
		if s.NoMarks {
			l.Width = vg.Points(1.5)
			p.Add(l)
			p.Legend.Add(s.Name, l)
			continue
		}
		p.Add(l, sc)
		p.Legend.Add(s.Name, l, sc)
	}
	return nil
}

func (c *Chart) bars(p *plot.Plot) error {
	n := len(c.Series)
	// Three quarters of each category's share of the plot's width go to
	// its bars, so groups stay apart and the value labels fit.
	const plotWidth = 560 // points, about the data area of an 800-pixel chart
	w := vg.Points(min(70, 0.75*plotWidth/float64(max(n*len(c.Categories), 1))))
	for i, s := range c.Series {
		b, err := plotter.NewBarChart(plotter.Values(s.Y), w)
		if err != nil {
			return err
		}
		b.Color = seriesColor(i)
		b.LineStyle.Width = 0
		b.Offset = w * vg.Length(float64(i)-float64(n-1)/2)
		p.Add(b)
		if n > 1 {
			p.Legend.Add(s.Name, b)
		}
		// Values on top of the bars, so the chart reads without a ruler.
		var xy plotter.XYLabels
		for k, v := range s.Y {
			xy.XYs = append(xy.XYs, plotter.XY{X: float64(k), Y: v})
			xy.Labels = append(xy.Labels, short(v))
		}
		lb, err := plotter.NewLabels(xy)
		if err != nil {
			return err
		}
		for k := range lb.TextStyle {
			lb.TextStyle[k].Font.Size = vg.Points(10)
			lb.TextStyle[k].XAlign = draw.XCenter
		}
		lb.Offset = vg.Point{X: b.Offset, Y: vg.Points(3)}
		p.Add(lb)
	}
	p.NominalX(c.Categories...)
	p.X.Min, p.X.Max = -0.5, float64(len(c.Categories))-0.5
	p.Y.Tick.Marker = linTicks{}
	p.Y.Min = 0
	top := 0.0
	for _, s := range c.Series {
		for _, v := range s.Y {
			if !math.IsNaN(v) {
				top = max(top, v)
			}
		}
	}
	p.Y.Max = top * 1.15
	if n > 1 {
		p.Y.Max = top * 1.3 // headroom for the legend
	}
	return nil
}

// short formats a value for a bar label.
func short(v float64) string {
	switch a := math.Abs(v); {
	case math.IsNaN(v):
		return "–"
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.3f", v)
}
