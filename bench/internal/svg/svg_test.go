package svg

import (
	"encoding/xml"
	"io"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func figure() *Figure {
	f := &Figure{Title: "a <title> & more", Cols: 2, Footnote: "made by a test"}
	f.Add(
		&LineChart{Title: "lines", XLabel: "x", YLabel: "y", LogY: true,
			Series:  []Series{{Name: "a", X: []float64{1, 2, 3}, Y: []float64{0.5, 5, 50}, Points: true}, {Name: "b", X: []float64{1, 2}, Y: []float64{math.NaN(), 0}}},
			Markers: []Marker{{X: 2, Label: "kill"}}, HLines: []Marker{{X: 10, Label: "bound"}}},
		&StackedBars{Title: "shares", X: []float64{0, 2, 4}, Categories: []string{"pod-0", "pod-1"}, Values: [][]float64{{1, 0, 3}, {1, 0, 1}}},
		&GroupedBars{Title: "bars", Groups: []string{"g1", "g2"}, Series: []Series{{Name: "s", Y: []float64{1, 2}}}, HLines: []Marker{{X: 1.5, Label: "target"}}},
		&Text{Title: "figures", Lines: []string{"x < y"}},
	)
	return f
}

// The output is well-formed XML, escapes text, and is deterministic.
func TestFigureIsWellFormedAndDeterministic(t *testing.T) {
	out := figure().String()
	d := xml.NewDecoder(strings.NewReader(out))
	elements := map[string]int{}
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v\n%s", err, out)
		}
		if se, ok := tok.(xml.StartElement); ok {
			elements[se.Name.Local]++
		}
	}
	if elements["svg"] != 1 || elements["polyline"] != 1 || elements["rect"] < 6 {
		t.Errorf("unexpected element counts %v", elements)
	}
	if !strings.Contains(out, "a &lt;title&gt; &amp; more") {
		t.Error("title not escaped")
	}
	if again := figure().String(); again != out {
		t.Error("two renderings of the same figure differ")
	}
}

func TestTicks(t *testing.T) {
	for _, tc := range []struct {
		lo, hi float64
		n      int
		want   []float64
	}{
		{0, 10, 5, []float64{0, 2, 4, 6, 8, 10}},
		{0, 1, 4, []float64{0, 0.25, 0.5, 0.75, 1}},
		{3, 3, 4, []float64{3}},
	} {
		if diff := cmp.Diff(ticks(tc.lo, tc.hi, tc.n), tc.want); diff != "" {
			t.Errorf("ticks(%v, %v, %d) (-got +want):\n%s", tc.lo, tc.hi, tc.n, diff)
		}
	}
}

func TestNiceCeil(t *testing.T) {
	for in, want := range map[float64]float64{0: 1, 0.9: 1, 1.1: 1.2, 7: 8, 1234: 1500, 100: 100} {
		if got := niceCeil(in); math.Abs(got-want) > 1e-9 {
			t.Errorf("niceCeil(%v) = %v, want %v", in, got, want)
		}
	}
}
