package telemetry_test

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

const dashboardPath = "../../deploy/grafana/tether-dashboard.json"

var (
	seriesRe   = regexp.MustCompile(`\b((?:tether|go|process)_[a-zA-Z0-9_]+)\s*(\{[^}]*\})?`)
	matcherRe  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	groupingRe = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	variableRe = regexp.MustCompile(`\$\{?([a-zA-Z_][a-zA-Z0-9_]*)`)
)

// exposedSeries maps every series name a scrape of tether can contain to
// its label names (Prometheus adds job and instance).
func exposedSeries(mfs []*dto.MetricFamily) map[string][]string {
	out := map[string][]string{}
	for _, mf := range mfs {
		labels := []string{"job", "instance"}
		if len(mf.GetMetric()) > 0 {
			for _, lp := range mf.GetMetric()[0].GetLabel() {
				labels = append(labels, lp.GetName())
			}
		}
		name := mf.GetName()
		switch mf.GetType() {
		case dto.MetricType_HISTOGRAM:
			out[name+"_bucket"] = append(slices.Clone(labels), "le")
			out[name+"_sum"] = labels
			out[name+"_count"] = labels
		case dto.MetricType_SUMMARY:
			out[name] = append(slices.Clone(labels), "quantile")
			out[name+"_sum"] = labels
			out[name+"_count"] = labels
		default:
			out[name] = labels
		}
	}
	return out
}

// dashboard is the part of the Grafana model the test reads.
type dashboard struct {
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int        `json:"id"`
	Type       string     `json:"type"`
	Title      string     `json:"title"`
	Datasource datasource `json:"datasource"`
	GridPos    struct{ X, Y, W, H int }
	Targets    []struct {
		Datasource datasource `json:"datasource"`
		Expr       string     `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// The dashboard parses, uses the templated Prometheus datasource, and
// every query names only series and labels tether exposes.
func TestDashboard(t *testing.T) {
	raw, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	if d.SchemaVersion < 36 {
		t.Errorf("schemaVersion %d", d.SchemaVersion)
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		if v.Name == "datasource" && (v.Type != "datasource" || v.Query != "prometheus") {
			t.Errorf("variable datasource: type %q query %v, want a prometheus datasource variable", v.Type, v.Query)
		}
	}
	if !vars["datasource"] {
		t.Fatal("no datasource variable")
	}

	series := exposedSeries(gather(t, exercisedMetrics(t)))
	var exprs []string
	ids := map[int]bool{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d used twice", p.ID)
			}
			ids[p.ID] = true
			if p.GridPos.X+p.GridPos.W > 24 {
				t.Errorf("panel %q is wider than the dashboard", p.Title)
			}
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if p.Datasource.UID != "${datasource}" || p.Datasource.Type != "prometheus" {
				t.Errorf("panel %q: datasource %+v, want the ${datasource} variable", p.Title, p.Datasource)
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				if tg.Datasource.UID != "${datasource}" {
					t.Errorf("panel %q: a target's datasource is %+v", p.Title, tg.Datasource)
				}
				exprs = append(exprs, tg.Expr)
			}
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(map[string]any); ok {
			exprs = append(exprs, q["query"].(string))
		}
	}

	used := map[string]bool{}
	for _, expr := range exprs {
		if strings.Count(expr, "(") != strings.Count(expr, ")") || strings.Count(expr, "{") != strings.Count(expr, "}") {
			t.Errorf("unbalanced: %s", expr)
		}
		var labels []string // of the series the expression reads
		for _, m := range seriesRe.FindAllStringSubmatch(expr, -1) {
			name := m[1]
			used[name] = true
			have, ok := series[name]
			if !ok {
				t.Errorf("%s is not exposed by tether (in %s)", name, expr)
				continue
			}
			labels = append(labels, have...)
			for _, lm := range matcherRe.FindAllStringSubmatch(m[2], -1) {
				if !slices.Contains(have, lm[1]) {
					t.Errorf("%s has no label %q (in %s)", name, lm[1], expr)
				}
			}
		}
		for _, g := range groupingRe.FindAllStringSubmatch(expr, -1) {
			for l := range strings.SplitSeq(g[1], ",") {
				if l = strings.TrimSpace(l); l != "" && !slices.Contains(labels, l) {
					t.Errorf("grouping by %q, which none of the series has (in %s)", l, expr)
				}
			}
		}
		for _, v := range variableRe.FindAllStringSubmatch(expr, -1) {
			if !vars[v[1]] && !strings.HasPrefix(v[1], "__") {
				t.Errorf("undefined variable $%s (in %s)", v[1], expr)
			}
		}
	}

	// What the dashboard is for.
	for _, want := range []string{
		"tether_backend_sessions", "tether_backend_inflight_requests", "tether_requests_total",
		"tether_reinitializations_total", "tether_request_duration_seconds_bucket",
		"tether_pick_duration_seconds_bucket", "tether_endpoints", "tether_store_degraded",
		"tether_store_operation_duration_seconds_bucket", "tether_store_errors_total",
		"tether_session_cache_hits_total", "tether_session_cache_misses_total",
	} {
		if !used[want] {
			t.Errorf("no panel shows %s", want)
		}
	}
	maxShare := false
	for _, expr := range exprs {
		if strings.HasPrefix(expr, "max(") && strings.Contains(expr, ") / sum(") && strings.Count(expr, "tether_backend_sessions") == 2 {
			maxShare = true
		}
	}
	if !maxShare {
		t.Error("no max-share-of-sessions panel: max(sessions per backend) / sum(sessions per backend)")
	}
}
