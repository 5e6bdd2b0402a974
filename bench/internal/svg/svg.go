// Package svg draws the benchmark report's charts as plain SVG text: line
// charts, stacked share bars and grouped bars, laid out as panels of one
// figure. It has no dependencies and its output is deterministic (the same
// data gives the same bytes), so the charts can be diffed and tested.
package svg

import (
	"fmt"
	"html"
	"math"
	"strconv"
	"strings"
)

// Palette is the series colours, in order (colour-blind friendly, Okabe–Ito).
var Palette = []string{"#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"}

// Color is the i-th palette colour, cycling.
func Color(i int) string { return Palette[i%len(Palette)] }

// Figure is a grid of panels written as one SVG document.
type Figure struct {
	Title    string
	Cols     int     // panels per row (default 1)
	PanelW   float64 // default 520
	PanelH   float64 // default 240
	panels   []Panel
	Footnote string
}

// Panel is one chart of a figure.
type Panel interface {
	// draw renders the panel into b inside the box (x, y, w, h).
	draw(b *strings.Builder, x, y, w, h float64)
}

// Add appends panels.
func (f *Figure) Add(p ...Panel) { f.panels = append(f.panels, p...) }

// String renders the figure.
func (f *Figure) String() string {
	cols := max(f.Cols, 1)
	pw, ph := f.PanelW, f.PanelH
	if pw == 0 {
		pw = 520
	}
	if ph == 0 {
		ph = 240
	}
	rows := (len(f.panels) + cols - 1) / cols
	top := 10.0
	if f.Title != "" {
		top = 34
	}
	bottom := 10.0
	if f.Footnote != "" {
		bottom = 28
	}
	w, h := float64(cols)*pw, top+float64(rows)*ph+bottom
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%s" height="%s" viewBox="0 0 %s %s" font-family="Helvetica, Arial, sans-serif" font-size="11">`+"\n",
		num(w), num(h), num(w), num(h))
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	if f.Title != "" {
		text(&b, w/2, 22, "middle", 15, "bold", f.Title)
	}
	for i, p := range f.panels {
		r, c := i/cols, i%cols
		p.draw(&b, float64(c)*pw, top+float64(r)*ph, pw, ph)
	}
	if f.Footnote != "" {
		text(&b, 8, h-10, "start", 10, "", f.Footnote)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// margins of a panel's plot area inside its box.
const (
	marginLeft   = 58.0
	marginRight  = 14.0
	marginTop    = 24.0
	marginBottom = 52.0
)

// Series is one line of a LineChart.
type Series struct {
	Name   string
	X, Y   []float64
	Dashed bool
	Points bool // draw a dot at each point
}

// Marker is a vertical line at X with a label.
type Marker struct {
	X     float64
	Label string
}

// LineChart plots series against a shared x axis.
type LineChart struct {
	Title          string
	XLabel, YLabel string
	LogY           bool
	// YMin/YMax fix the y range when YMax > YMin; otherwise it fits the data
	// (from 0 on a linear axis).
	YMin, YMax float64
	Series     []Series
	Markers    []Marker
	HLines     []Marker // horizontal reference lines (X is the y value)
}

func (c *LineChart) draw(b *strings.Builder, x, y, w, h float64) {
	px, py, pw, ph := x+marginLeft, y+marginTop, w-marginLeft-marginRight, h-marginTop-marginBottom
	text(b, x+w/2, y+15, "middle", 12, "bold", c.Title)
	xmin, xmax := math.Inf(1), math.Inf(-1)
	ymin, ymax := math.Inf(1), math.Inf(-1)
	for _, s := range c.Series {
		for i := range s.X {
			if i >= len(s.Y) || !finite(s.Y[i]) || (c.LogY && s.Y[i] <= 0) {
				continue
			}
			xmin, xmax = math.Min(xmin, s.X[i]), math.Max(xmax, s.X[i])
			ymin, ymax = math.Min(ymin, s.Y[i]), math.Max(ymax, s.Y[i])
		}
	}
	for _, m := range c.HLines {
		ymin, ymax = math.Min(ymin, m.X), math.Max(ymax, m.X)
	}
	if !finite(xmin) {
		xmin, xmax, ymin, ymax = 0, 1, 0, 1
	}
	if c.YMax > c.YMin {
		ymin, ymax = c.YMin, c.YMax
	} else if !c.LogY {
		ymin = math.Min(0, ymin)
		ymax = niceCeil(ymax)
	}
	if xmax == xmin {
		xmax = xmin + 1
	}
	if ymax <= ymin {
		ymax = ymin + 1
	}
	ys := linear(ymin, ymax, py+ph, py)
	if c.LogY {
		ymin = math.Pow(10, math.Floor(math.Log10(ymin)))
		ymax = math.Pow(10, math.Ceil(math.Log10(ymax)))
		if ymax <= ymin {
			ymax = ymin * 10
		}
		ys = logScale(ymin, ymax, py+ph, py)
	}
	xs := linear(xmin, xmax, px, px+pw)
	axes(b, px, py, pw, ph, c.XLabel, c.YLabel)
	for _, t := range ticks(xmin, xmax, 6) {
		tickX(b, xs(t), py+ph, fmtTick(t))
	}
	if c.LogY {
		for e := math.Log10(ymin); e <= math.Log10(ymax)+1e-9; e++ {
			v := math.Pow(10, e)
			tickY(b, px, pw, ys(v), fmtTick(v))
		}
	} else {
		for _, t := range ticks(ymin, ymax, 5) {
			tickY(b, px, pw, ys(t), fmtTick(t))
		}
	}
	for _, m := range c.HLines {
		fmt.Fprintf(b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#888" stroke-dasharray="2,3"/>`+"\n", num(px), num(ys(m.X)), num(px+pw), num(ys(m.X)))
		text(b, px+pw-2, ys(m.X)-3, "end", 9, "", m.Label)
	}
	for _, m := range c.Markers {
		if m.X < xmin || m.X > xmax {
			continue
		}
		fmt.Fprintf(b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#c00" stroke-dasharray="4,3"/>`+"\n", num(xs(m.X)), num(py), num(xs(m.X)), num(py+ph))
		text(b, xs(m.X)+3, py+10, "start", 10, "", m.Label)
	}
	for i, s := range c.Series {
		var pts []string
		for j := range s.X {
			if j >= len(s.Y) || !finite(s.Y[j]) || (c.LogY && s.Y[j] <= 0) {
				continue
			}
			pts = append(pts, num(xs(s.X[j]))+","+num(ys(clamp(s.Y[j], ymin, ymax))))
		}
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="5,3"`
		}
		if len(pts) > 0 {
			fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="1.6"%s points="%s"/>`+"\n", Color(i), dash, strings.Join(pts, " "))
		}
		if s.Points {
			for _, p := range pts {
				xy := strings.Split(p, ",")
				fmt.Fprintf(b, `<circle cx="%s" cy="%s" r="2.2" fill="%s"/>`+"\n", xy[0], xy[1], Color(i))
			}
		}
	}
	legend(b, x+marginLeft, y+h-14, names(c.Series))
}

// StackedBars shows, per x bucket, how a whole splits among categories
// (shares of sessions per backend over time, for instance). Values[k][i] is
// category k in bucket i; each bucket is drawn as shares of its total.
type StackedBars struct {
	Title      string
	XLabel     string
	X          []float64 // bucket positions (start of each bucket)
	Categories []string
	Values     [][]float64
	Note       string // right-aligned under the title (e.g. an error count)
}

func (c *StackedBars) draw(b *strings.Builder, x, y, w, h float64) {
	px, py, pw, ph := x+marginLeft, y+marginTop, w-marginLeft-marginRight, h-marginTop-marginBottom
	text(b, x+w/2, y+15, "middle", 12, "bold", c.Title)
	if c.Note != "" {
		text(b, x+w-marginRight, y+15, "end", 10, "", c.Note)
	}
	axes(b, px, py, pw, ph, c.XLabel, "share")
	ys := linear(0, 1, py+ph, py)
	for _, t := range []float64{0, 0.25, 0.5, 0.75, 1} {
		tickY(b, px, pw, ys(t), strconv.Itoa(int(t*100))+"%")
	}
	n := len(c.X)
	if n == 0 {
		return
	}
	bw := pw / float64(n)
	step := max(1, n/8)
	for i := range n {
		total := 0.0
		for k := range c.Values {
			total += c.Values[k][i]
		}
		bx := px + float64(i)*bw
		if i%step == 0 {
			tickX(b, bx+bw/2, py+ph, fmtTick(c.X[i]))
		}
		if total == 0 {
			continue
		}
		acc := 0.0
		for k := range c.Values {
			v := c.Values[k][i] / total
			if v <= 0 {
				continue
			}
			fmt.Fprintf(b, `<rect x="%s" y="%s" width="%s" height="%s" fill="%s"/>`+"\n",
				num(bx+0.5), num(ys(acc+v)), num(math.Max(bw-1, 0.5)), num(ys(acc)-ys(acc+v)), Color(k))
			acc += v
		}
	}
	legend(b, x+marginLeft, y+h-14, c.Categories)
}

// GroupedBars draws, for each group, one bar per series.
type GroupedBars struct {
	Title  string
	YLabel string
	Groups []string
	Series []Series // Y[i] is the value for Groups[i]; X is unused
	HLines []Marker // horizontal reference lines (X is the y value)
	YMax   float64  // fixes the y range when > 0
}

func (c *GroupedBars) draw(b *strings.Builder, x, y, w, h float64) {
	px, py, pw, ph := x+marginLeft, y+marginTop, w-marginLeft-marginRight, h-marginTop-marginBottom
	text(b, x+w/2, y+15, "middle", 12, "bold", c.Title)
	ymax := c.YMax
	if ymax <= 0 {
		for _, s := range c.Series {
			for _, v := range s.Y {
				if finite(v) {
					ymax = math.Max(ymax, v)
				}
			}
		}
		for _, m := range c.HLines {
			ymax = math.Max(ymax, m.X)
		}
		ymax = niceCeil(ymax * 1.05)
	}
	if ymax <= 0 {
		ymax = 1
	}
	axes(b, px, py, pw, ph, "", c.YLabel)
	ys := linear(0, ymax, py+ph, py)
	for _, t := range ticks(0, ymax, 5) {
		tickY(b, px, pw, ys(t), fmtTick(t))
	}
	ng, ns := len(c.Groups), len(c.Series)
	if ng == 0 || ns == 0 {
		return
	}
	gw := pw / float64(ng)
	bw := gw * 0.8 / float64(ns)
	for g, name := range c.Groups {
		gx := px + float64(g)*gw
		text(b, gx+gw/2, py+ph+14, "middle", 10, "", name)
		for s, ser := range c.Series {
			if g >= len(ser.Y) || !finite(ser.Y[g]) {
				continue
			}
			v := clamp(ser.Y[g], 0, ymax)
			bx := gx + gw*0.1 + float64(s)*bw
			fmt.Fprintf(b, `<rect x="%s" y="%s" width="%s" height="%s" fill="%s"><title>%s: %s</title></rect>`+"\n",
				num(bx), num(ys(v)), num(math.Max(bw-1, 0.5)), num(ys(0)-ys(v)), Color(s), esc(ser.Name), fmtTick(ser.Y[g]))
		}
	}
	for _, m := range c.HLines {
		fmt.Fprintf(b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#c00" stroke-dasharray="4,3"/>`+"\n", num(px), num(ys(m.X)), num(px+pw), num(ys(m.X)))
		text(b, px+pw-2, ys(m.X)-3, "end", 9, "", m.Label)
	}
	legend(b, x+marginLeft, y+h-14, names(c.Series))
}

// Text is a panel of plain lines (a table of figures beside the charts).
type Text struct {
	Title string
	Lines []string
}

func (c *Text) draw(b *strings.Builder, x, y, w, h float64) {
	text(b, x+w/2, y+15, "middle", 12, "bold", c.Title)
	for i, l := range c.Lines {
		fmt.Fprintf(b, `<text x="%s" y="%s" font-family="monospace" font-size="10" xml:space="preserve">%s</text>`+"\n",
			num(x+12), num(y+36+float64(i)*13), esc(l))
	}
}

func names(ss []Series) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.Name
	}
	return out
}

func axes(b *strings.Builder, px, py, pw, ph float64, xl, yl string) {
	fmt.Fprintf(b, `<rect x="%s" y="%s" width="%s" height="%s" fill="none" stroke="#333" stroke-width="0.8"/>`+"\n", num(px), num(py), num(pw), num(ph))
	if xl != "" {
		text(b, px+pw/2, py+ph+28, "middle", 10, "", xl)
	}
	if yl != "" {
		fmt.Fprintf(b, `<text x="%s" y="%s" text-anchor="middle" font-size="10" transform="rotate(-90 %s %s)">%s</text>`+"\n",
			num(px-44), num(py+ph/2), num(px-44), num(py+ph/2), esc(yl))
	}
}

func tickX(b *strings.Builder, x, y float64, label string) {
	fmt.Fprintf(b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#333"/>`+"\n", num(x), num(y), num(x), num(y+4))
	text(b, x, y+14, "middle", 9, "", label)
}

func tickY(b *strings.Builder, px, pw, y float64, label string) {
	fmt.Fprintf(b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#e4e4e4"/>`+"\n", num(px), num(y), num(px+pw), num(y))
	text(b, px-4, y+3, "end", 9, "", label)
}

func legend(b *strings.Builder, x, y float64, labels []string) {
	for i, l := range labels {
		fmt.Fprintf(b, `<rect x="%s" y="%s" width="10" height="10" fill="%s"/>`+"\n", num(x), num(y-9), Color(i))
		text(b, x+13, y, "start", 10, "", l)
		x += 22 + 6*float64(len(l))
	}
}

func text(b *strings.Builder, x, y float64, anchor string, size float64, weight, s string) {
	if s == "" {
		return
	}
	w := ""
	if weight != "" {
		w = ` font-weight="` + weight + `"`
	}
	fmt.Fprintf(b, `<text x="%s" y="%s" text-anchor="%s" font-size="%s"%s>%s</text>`+"\n", num(x), num(y), anchor, num(size), w, esc(s))
}

func esc(s string) string { return html.EscapeString(s) }

func num(v float64) string { return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64) }

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

func clamp(v, lo, hi float64) float64 { return math.Max(lo, math.Min(hi, v)) }

func linear(d0, d1, r0, r1 float64) func(float64) float64 {
	return func(v float64) float64 { return r0 + (v-d0)/(d1-d0)*(r1-r0) }
}

func logScale(d0, d1, r0, r1 float64) func(float64) float64 {
	l0, l1 := math.Log10(d0), math.Log10(d1)
	return func(v float64) float64 {
		if v <= 0 {
			return r0
		}
		return r0 + (math.Log10(v)-l0)/(l1-l0)*(r1-r0)
	}
}

// ticks returns about n round values covering [lo, hi].
func ticks(lo, hi float64, n int) []float64 {
	if hi <= lo || n < 1 {
		return []float64{lo}
	}
	step := niceStep((hi - lo) / float64(n))
	var out []float64
	for v := math.Ceil(lo/step) * step; v <= hi+step*1e-9; v += step {
		out = append(out, math.Round(v/step)*step)
	}
	return out
}

func niceStep(raw float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

// niceCeil rounds v up to a round number (1, 2, 2.5, 5 × a power of ten).
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10} {
		if m*p >= v*(1-1e-12) {
			return m * p
		}
	}
	return 10 * p
}

func fmtTick(v float64) string {
	a := math.Abs(v)
	switch {
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', -1, 64) + "M"
	case a >= 1e4:
		return strconv.FormatFloat(v/1e3, 'f', -1, 64) + "k"
	case a >= 100 || a == 0:
		return strconv.FormatFloat(math.Round(v), 'f', -1, 64)
	case a >= 1:
		return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64)
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}
