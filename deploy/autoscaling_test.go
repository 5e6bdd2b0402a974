package deploy_test

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"text/template"
	"time"

	"github.com/google/go-cmp/cmp"
	yaml2 "go.yaml.in/yaml/v2"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"

	"github.com/tether-mcp/tether/internal/inject"
	"github.com/tether-mcp/tether/internal/kubetest"
	"github.com/tether-mcp/tether/internal/telemetry"
)

// The autoscaling recipe of deploy/autoscaling (its README.md): a
// PodMonitor that scrapes tether and labels the series with the backend
// Service, prometheus-adapter rules that make external metrics of them, an
// HPA on those metrics, and a KEDA ScaledObject asking Prometheus the same.
// The checks follow the data from tether's registry to the autoscaler:
// every metric a query names is one tether registers (so renaming a metric
// in internal/telemetry breaks this test), every label it matches or groups
// by is one the series carry (tether's own, or added by the scrape), the
// HPA asks for a metric the adapter produces, and the query the adapter
// sends for the HPA is the one KEDA sends.

// The recipe's directories, each a kustomization.
var autoscalingDirs = []string{"autoscaling/podmonitor", "autoscaling/prometheus-adapter", "autoscaling/hpa", "autoscaling/keda"}

// recipe is deploy/autoscaling, rendered and decoded.
type recipe struct {
	podMonitor   *PodMonitor
	adapterCM    *corev1.ConfigMap
	hpa          *autoscalingv2.HorizontalPodAutoscaler
	scaledObject *ScaledObject
	// the toolhive example the defaults point at
	example []runtime.Object
}

func only[T runtime.Object](t *testing.T, dir string, objs []runtime.Object) T {
	t.Helper()
	var found []T
	for _, o := range objs {
		if v, ok := o.(T); ok {
			found = append(found, v)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("%s: %d objects of type %T, want 1", dir, len(found), zero)
	}
	return found[0]
}

func loadRecipe(t *testing.T) recipe {
	t.Helper()
	return recipe{
		podMonitor:   only[*PodMonitor](t, "autoscaling/podmonitor", render(t, "autoscaling/podmonitor")),
		adapterCM:    only[*corev1.ConfigMap](t, "autoscaling/prometheus-adapter", render(t, "autoscaling/prometheus-adapter")),
		hpa:          only[*autoscalingv2.HorizontalPodAutoscaler](t, "autoscaling/hpa", render(t, "autoscaling/hpa")),
		scaledObject: only[*ScaledObject](t, "autoscaling/keda", render(t, "autoscaling/keda")),
		example:      render(t, "examples/toolhive"),
	}
}

// tetherSeries maps each series name a scrape of tether can hold to its
// label names, from a real telemetry.Metrics registry with every
// collector present (endpoints, store, limits).
func tetherSeries(t *testing.T) map[string][]string {
	t.Helper()
	m := telemetry.NewMetrics(telemetry.MetricsOptions{
		Endpoints: func() []telemetry.EndpointStat {
			return []telemetry.EndpointStat{{ID: "uid-1", URL: "http://10.0.1.7:8080", State: "ready", Sessions: 3, Inflight: 1}}
		},
		Store: func() telemetry.StoreStat {
			return telemetry.StoreStat{Topology: "single", Primaries: []string{"10.0.0.9:6379"}}
		},
		Limits: func() telemetry.LimitStat { return telemetry.LimitStat{} },
	})
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, mf := range mfs {
		var names []string
		if ms := mf.GetMetric(); len(ms) > 0 {
			for _, l := range ms[0].GetLabel() {
				names = append(names, l.GetName())
			}
		}
		out[mf.GetName()] = names
	}
	for _, want := range []string{"tether_backend_sessions", "tether_backend_inflight_requests", "tether_endpoints"} {
		if _, ok := out[want]; !ok {
			t.Fatalf("tether's registry has no %s: the recipe and docs/reference.md name it", want)
		}
	}
	return out
}

// Labels Prometheus adds to every series of a PodMonitor's targets: the
// Prometheus Operator's target labels and Prometheus' instance.
var podMonitorTargetLabels = []string{"job", "instance", "namespace", "pod", "container", "endpoint"}

// annotationMetaLabel is the label Prometheus' Kubernetes discovery gives a
// pod annotation: any character outside [a-zA-Z0-9_] becomes "_".
func annotationMetaLabel(annotation string) string {
	return "__meta_kubernetes_pod_annotation_" + regexp.MustCompile(`[^a-zA-Z0-9_]`).ReplaceAllString(annotation, "_")
}

// relabelReplace applies a Prometheus relabel rule of action replace to a
// value (the regex is anchored, as Prometheus anchors it).
func relabelReplace(rc RelabelConfig, value string) (string, bool) {
	regex := rc.Regex
	if regex == "" {
		regex = "(.*)"
	}
	re, err := regexp.Compile("^(?:" + regex + ")$")
	if err != nil {
		return "", false
	}
	m := re.FindStringSubmatchIndex(value)
	if m == nil {
		return "", false
	}
	repl := "$1"
	if rc.Replacement != nil {
		repl = *rc.Replacement
	}
	return string(re.ExpandString(nil, repl, value, m)), true
}

// scrapeLabels checks the PodMonitor against the sidecar and returns the
// labels its targets' series carry besides tether's own, and the label
// that names the backend Service.
func scrapeLabels(pm *PodMonitor) (targetLabels []string, serviceLabel string, problems []string) {
	admin := inject.DefaultConfig("any").Container()
	if len(admin.Ports) == 0 {
		return nil, "", []string{"inject's container has no port"}
	}
	var ep *PodMetricsEndpoint
	for i := range pm.Spec.PodMetricsEndpoints {
		if p := pm.Spec.PodMetricsEndpoints[i].Port; p != nil && *p == admin.Ports[0].Name {
			ep = &pm.Spec.PodMetricsEndpoints[i]
		}
	}
	if ep == nil {
		return nil, "", []string{fmt.Sprintf("PodMonitor %s: no endpoint on port %q, tether's admin port", pm.Name, admin.Ports[0].Name)}
	}
	if ep.Path != "" && ep.Path != "/metrics" {
		problems = append(problems, fmt.Sprintf("PodMonitor %s: path %q, tether serves /metrics", pm.Name, ep.Path))
	}
	targetLabels = slices.Clone(podMonitorTargetLabels)
	source := annotationMetaLabel(inject.AnnotationService)
	for _, rc := range ep.RelabelConfigs {
		if rc.TargetLabel == "" || strings.HasPrefix(rc.TargetLabel, "__") {
			continue
		}
		targetLabels = append(targetLabels, rc.TargetLabel)
		if !slices.Equal(rc.SourceLabels, []string{source}) || (rc.Action != "" && !strings.EqualFold(rc.Action, "replace")) {
			continue
		}
		// Both forms of the annotation give the Service's name, a value an
		// HPA's label selector can match.
		for _, ann := range []string{"mcp-fetch", "mcp-demo/mcp-fetch"} {
			if got, ok := relabelReplace(rc, ann); !ok || got != "mcp-fetch" {
				problems = append(problems, fmt.Sprintf("PodMonitor %s: relabeling %s=%q gives %s=%q, want %q", pm.Name, source, ann, rc.TargetLabel, got, "mcp-fetch"))
			}
		}
		serviceLabel = rc.TargetLabel
	}
	if serviceLabel == "" {
		problems = append(problems, fmt.Sprintf("PodMonitor %s: no relabeling copies %s (the %s annotation) into a label", pm.Name, source, inject.AnnotationService))
	}
	return targetLabels, serviceLabel, problems
}

// externalMetric is one metric the adapter serves, from one rule.
type externalMetric struct {
	rule   adapterRule
	series string // the Prometheus series the rule's metricsQuery reads
}

// namespaceLabel is the label the rule maps to the namespace resource;
// "" when the rule is not namespaced (the HPA's namespace then does not
// restrict the query).
func (r adapterRule) namespaceLabel() string {
	if r.Resources.Namespaced != nil && !*r.Resources.Namespaced {
		return ""
	}
	for l, o := range r.Resources.Overrides {
		if o.Resource == "namespace" || o.Resource == "namespaces" {
			return l
		}
	}
	return ""
}

// adapterMetrics parses the adapter's configuration the way the adapter
// does (yaml.v2 UnmarshalStrict), checks each external rule against
// tether's series, and returns the external metrics by API name.
func adapterMetrics(cm *corev1.ConfigMap, series map[string][]string, targetLabels []string) (map[string]externalMetric, []string) {
	var problems []string
	raw, ok := cm.Data["config.yaml"]
	if !ok {
		return nil, []string{fmt.Sprintf("ConfigMap %s has no config.yaml (the file the adapter's --config names)", cm.Name)}
	}
	var cfg adapterConfig
	if err := yaml2.UnmarshalStrict([]byte(raw), &cfg); err != nil {
		return nil, []string{fmt.Sprintf("ConfigMap %s: config.yaml: %v", cm.Name, err)}
	}
	if len(cfg.ExternalRules) == 0 {
		problems = append(problems, "the adapter's config has no externalRules")
	}
	out := map[string]externalMetric{}
	for i, rule := range cfg.ExternalRules {
		where := fmt.Sprintf("externalRules[%d]", i)
		q, err := parsePromQL(rule.SeriesQuery)
		if err != nil || len(q.selectors) != 1 || len(q.grouping) > 0 || len(q.functions) > 0 {
			problems = append(problems, fmt.Sprintf("%s: seriesQuery %q is not one series selector (%v)", where, rule.SeriesQuery, err))
			continue
		}
		problems = append(problems, q.check(where+" seriesQuery", series, targetLabels)...)
		name := q.selectors[0].name
		if rule.namespaceLabel() == "" {
			problems = append(problems, fmt.Sprintf("%s: no resources.overrides entry maps a label to the namespace resource: the HPA's namespace would not restrict the query", where))
		} else if l := rule.namespaceLabel(); !slices.Contains(targetLabels, l) {
			problems = append(problems, fmt.Sprintf("%s: the namespace is label %q, which the series do not have", where, l))
		}
		if strings.Contains(rule.MetricsQuery, ".GroupBy") {
			problems = append(problems, fmt.Sprintf("%s: metricsQuery uses .GroupBy, which is empty for external metrics", where))
		}
		if _, err := template.New(where).Delims("<<", ">>").Parse(rule.MetricsQuery); err != nil {
			problems = append(problems, fmt.Sprintf("%s: metricsQuery: %v", where, err))
			continue
		}
		// The metric's API name, as the adapter's namer makes it from the
		// series name.
		matches := rule.Name.Matches
		re, err := regexp.Compile(matches)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: name.matches: %v", where, err))
			continue
		}
		as := rule.Name.As
		if as == "" {
			switch re.NumSubexp() {
			case 0:
				as = "$0"
			case 1:
				as = "$1"
			default:
				problems = append(problems, fmt.Sprintf("%s: name.as is empty and name.matches has several groups", where))
				continue
			}
		}
		m := re.FindStringSubmatchIndex(name)
		if m == nil {
			problems = append(problems, fmt.Sprintf("%s: name.matches %q does not match the series %s: the rule makes no metric", where, matches, name))
			continue
		}
		apiName := string(re.ExpandString(nil, as, name, m))
		if _, dup := out[apiName]; dup {
			problems = append(problems, fmt.Sprintf("%s: external metric %s made twice", where, apiName))
		}
		out[apiName] = externalMetric{rule: rule, series: name}
	}
	return out, problems
}

// query is what the adapter sends Prometheus for an external metric asked
// with selector from an HPA in namespace (prometheus-adapter
// pkg/naming/metrics_query.go, BuildExternal): the selector's
// requirements, then the namespace, as matchers; no GroupBy.
func (em externalMetric) query(namespace string, selector labels.Selector) (string, error) {
	reqs, _ := selector.Requirements()
	var exprs []string
	byName := map[string]string{}
	for _, r := range reqs {
		vals := r.Values().List()
		switch {
		case (r.Operator() == selection.Equals || r.Operator() == selection.DoubleEquals) && len(vals) == 1:
			exprs = append(exprs, fmt.Sprintf("%s=%q", r.Key(), vals[0]))
		case r.Operator() == selection.In && len(vals) >= 1:
			exprs = append(exprs, fmt.Sprintf("%s=~%q", r.Key(), strings.Join(vals, "|")))
		default:
			return "", fmt.Errorf("selector requirement %s: this test renders only = and in", r)
		}
		byName[r.Key()] = strings.Join(vals, "|")
	}
	if l := em.rule.namespaceLabel(); l != "" && namespace != "" {
		exprs = append(exprs, fmt.Sprintf("%s=%q", l, namespace))
		byName[l] = namespace
	}
	tmpl, err := template.New("metricsQuery").Delims("<<", ">>").Parse(em.rule.MetricsQuery)
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	err = tmpl.Execute(&b, struct {
		Series            string
		LabelMatchers     string
		LabelValuesByName map[string]string
		GroupBy           string
		GroupBySlice      []string
	}{em.series, strings.Join(exprs, ","), byName, "", nil})
	return b.String(), err
}

// The one question both autoscalers ask about sessions: the live sessions
// of one MCP server, each counted once. With Redis, every tether replica
// reports every backend's fleet-wide count, so the replicas' series of a
// backend are deduplicated with max, and the backends summed. (tether's
// in-flight requests are each replica's own: summed.)
var (
	sessionsQueryRe = regexp.MustCompile(`^sum\(\s*max by \(backend\) \(\s*tether_backend_sessions\{[^}]*\}\s*\)\s*\)$`)
	inflightQueryRe = regexp.MustCompile(`^sum\(\s*(?:avg_over_time\(\s*)?tether_backend_inflight_requests\{[^}]*\}(?:\[\w+\]\s*\))?\s*\)$`)
)

// querySemantics checks a query that reads tether_backend_sessions or
// tether_backend_inflight_requests aggregates it as the series require.
func querySemantics(where, q string) []string {
	switch {
	case strings.Contains(q, "tether_backend_sessions") && !sessionsQueryRe.MatchString(q):
		return []string{fmt.Sprintf("%s: %s: sessions must be sum(max by (backend) (tether_backend_sessions{...})): each replica reports a backend's fleet-wide count with Redis", where, q)}
	case strings.Contains(q, "tether_backend_inflight_requests") && !inflightQueryRe.MatchString(q):
		return []string{fmt.Sprintf("%s: %s: in-flight requests are each replica's own: sum(...) of them", where, q)}
	}
	return nil
}

// The metadata keys of KEDA's prometheus scaler (v2.20
// pkg/scalers/prometheus_scaler.go prometheusMetadata, and the
// authentication keys it reads from trigger metadata).
var (
	kedaPrometheusKeys = []string{
		"serverAddress", "query", "queryParameters", "threshold", "activationThreshold", "namespace",
		"customHeaders", "ignoreNullValues", "unsafeSsl", "awsRegion", "timeout", "identityOwner",
		"authModes", "authMode", "apiKey", "method", "keyParamName",
	}
	kedaPrometheusRequired = []string{"serverAddress", "query", "threshold"}
)

// problems runs every check of the recipe against tether's series.
func (r recipe) problems(series map[string][]string) []string {
	targetLabels, serviceLabel, problems := scrapeLabels(r.podMonitor)
	metrics, ps := adapterMetrics(r.adapterCM, series, targetLabels)
	problems = append(problems, ps...)

	// The example the defaults point at: the Service its proxies' tethers
	// balance over, and the Deployment whose pods are behind it (the
	// backends, which the autoscalers scale; not the proxy).
	var exampleService string
	for _, o := range r.example {
		if d, ok := o.(*appsv1.Deployment); ok {
			if s := d.Spec.Template.Annotations[inject.AnnotationService]; s != "" {
				exampleService = s
			}
		}
	}
	svc := find(r.example, exampleService, func(s *corev1.Service) string { return s.Name })
	backend := find(r.example, r.hpa.Spec.ScaleTargetRef.Name, func(d *appsv1.Deployment) string { return d.Name })
	switch {
	case svc == nil:
		problems = append(problems, fmt.Sprintf("examples/toolhive: no proxy annotated %s with a Service of the example", inject.AnnotationService))
	case backend == nil || backend.Namespace != r.hpa.Namespace:
		problems = append(problems, fmt.Sprintf("examples/toolhive has no Deployment %s/%s (the HPA's target)", r.hpa.Namespace, r.hpa.Spec.ScaleTargetRef.Name))
	case !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(backend.Spec.Template.Labels)):
		problems = append(problems, fmt.Sprintf("the HPA scales Deployment %s, whose pods are not behind Service %s: scale the backends, not the proxy", backend.Name, svc.Name))
	}

	// The HPA.
	hpa := r.hpa
	ref := hpa.Spec.ScaleTargetRef
	if ref.APIVersion != "apps/v1" || ref.Kind != "Deployment" || ref.Name == "" {
		problems = append(problems, fmt.Sprintf("HPA %s: scaleTargetRef %+v, want an apps/v1 Deployment", hpa.Name, ref))
	}
	if hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas < 2 {
		problems = append(problems, fmt.Sprintf("HPA %s: minReplicas %v: a draining pod needs another to take its sessions", hpa.Name, hpa.Spec.MinReplicas))
	}
	var hpaSessions string // the query the adapter sends for the sessions metric
	for i, ms := range hpa.Spec.Metrics {
		where := fmt.Sprintf("HPA %s metrics[%d]", hpa.Name, i)
		if ms.Type != autoscalingv2.ExternalMetricSourceType || ms.External == nil {
			problems = append(problems, fmt.Sprintf("%s: type %s, want External", where, ms.Type))
			continue
		}
		ext := ms.External
		if ext.Target.Type != autoscalingv2.AverageValueMetricType || ext.Target.AverageValue == nil || ext.Target.AverageValue.Sign() <= 0 {
			problems = append(problems, fmt.Sprintf("%s: target %+v, want AverageValue > 0 (the metric is the server's total: the target is per pod)", where, ext.Target))
		}
		em, ok := metrics[ext.Metric.Name]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s: external metric %q, which no adapter rule makes (they make %v)", where, ext.Metric.Name, slices.Sorted(maps.Keys(metrics))))
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(ext.Metric.Selector)
		if err != nil || ext.Metric.Selector == nil {
			problems = append(problems, fmt.Sprintf("%s: selector %v: %v", where, ext.Metric.Selector, err))
			continue
		}
		if got := ext.Metric.Selector.MatchLabels[serviceLabel]; serviceLabel != "" && got != exampleService {
			problems = append(problems, fmt.Sprintf("%s: selector %s=%q, want the proxies' %s %q: several MCP servers of a namespace would mix", where, serviceLabel, got, inject.AnnotationService, exampleService))
		}
		q, err := em.query(hpa.Namespace, sel)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", where, err))
			continue
		}
		pq, err := parsePromQL(q)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: the adapter would send %q: %v", where, q, err))
			continue
		}
		problems = append(problems, pq.check(where+": the adapter's query", series, targetLabels)...)
		problems = append(problems, querySemantics(where, q)...)
		if em.series == "tether_backend_sessions" {
			hpaSessions = q
		}
	}
	if hpaSessions == "" {
		problems = append(problems, fmt.Sprintf("HPA %s: no metric on tether_backend_sessions (live sessions)", hpa.Name))
	}
	problems = append(problems, behaviorProblems("HPA "+hpa.Name, hpa.Spec.Behavior)...)

	// The ScaledObject.
	so := r.scaledObject
	if t := so.Spec.ScaleTargetRef; t == nil || t.Name != ref.Name || (t.Kind != "" && t.Kind != "Deployment") || (t.APIVersion != "" && t.APIVersion != "apps/v1") {
		problems = append(problems, fmt.Sprintf("ScaledObject %s: scaleTargetRef %+v, want the HPA's Deployment %s", so.Name, t, ref.Name))
	}
	if so.Namespace != hpa.Namespace {
		problems = append(problems, fmt.Sprintf("ScaledObject %s in %q, HPA in %q", so.Name, so.Namespace, hpa.Namespace))
	}
	if so.Spec.MinReplicaCount == nil || *so.Spec.MinReplicaCount < 2 || so.Spec.IdleReplicaCount != nil {
		problems = append(problems, fmt.Sprintf("ScaledObject %s: minReplicaCount %v, idleReplicaCount %v: want 2 or more and no idle count", so.Name, so.Spec.MinReplicaCount, so.Spec.IdleReplicaCount))
	}
	if len(so.Spec.Triggers) == 0 {
		problems = append(problems, fmt.Sprintf("ScaledObject %s: no triggers", so.Name))
	}
	var kedaSessions string
	for i, tr := range so.Spec.Triggers {
		where := fmt.Sprintf("ScaledObject %s triggers[%d]", so.Name, i)
		if tr.Type != "prometheus" {
			problems = append(problems, fmt.Sprintf("%s: type %q, want prometheus", where, tr.Type))
			continue
		}
		if tr.MetricType != "" && tr.MetricType != autoscalingv2.AverageValueMetricType {
			problems = append(problems, fmt.Sprintf("%s: metricType %s, want AverageValue (threshold per pod)", where, tr.MetricType))
		}
		for k := range tr.Metadata {
			if !slices.Contains(kedaPrometheusKeys, k) {
				problems = append(problems, fmt.Sprintf("%s: metadata.%s is not a key of KEDA's prometheus scaler", where, k))
			}
		}
		for _, k := range kedaPrometheusRequired {
			if tr.Metadata[k] == "" {
				problems = append(problems, fmt.Sprintf("%s: metadata.%s is required", where, k))
			}
		}
		if th, err := strconv.ParseFloat(tr.Metadata["threshold"], 64); err != nil || th <= 0 {
			problems = append(problems, fmt.Sprintf("%s: threshold %q, want a number > 0", where, tr.Metadata["threshold"]))
		}
		if v, err := strconv.ParseBool(tr.Metadata["ignoreNullValues"]); err != nil || v {
			problems = append(problems, fmt.Sprintf("%s: ignoreNullValues %q, want \"false\": an empty answer must not read as 0 sessions", where, tr.Metadata["ignoreNullValues"]))
		}
		q := tr.Metadata["query"]
		pq, err := parsePromQL(q)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: query %q: %v", where, q, err))
			continue
		}
		problems = append(problems, pq.check(where+" query", series, targetLabels)...)
		problems = append(problems, querySemantics(where, q)...)
		// KEDA's query is sent as written: it must select this server's
		// series itself.
		for _, s := range pq.selectors {
			if ns := s.value("namespace"); ns != so.Namespace {
				problems = append(problems, fmt.Sprintf("%s: query selects namespace=%q, the ScaledObject is in %q", where, ns, so.Namespace))
			}
			if svc := s.value(serviceLabel); serviceLabel != "" && svc != exampleService {
				problems = append(problems, fmt.Sprintf("%s: query selects %s=%q, want %q", where, serviceLabel, svc, exampleService))
			}
		}
		if strings.Contains(q, "tether_backend_sessions") {
			kedaSessions = q
		}
	}
	if kedaSessions == "" {
		problems = append(problems, fmt.Sprintf("ScaledObject %s: no trigger on tether_backend_sessions", so.Name))
	} else if hpaSessions != "" && canonicalPromQL(kedaSessions) != canonicalPromQL(hpaSessions) {
		problems = append(problems, fmt.Sprintf("the two recipes ask different questions about sessions:\n  KEDA: %s\n  HPA (via the adapter): %s", kedaSessions, hpaSessions))
	}
	var soBehavior *autoscalingv2.HorizontalPodAutoscalerBehavior
	if a := so.Spec.Advanced; a != nil && a.HorizontalPodAutoscalerConfig != nil {
		soBehavior = a.HorizontalPodAutoscalerConfig.Behavior
	}
	problems = append(problems, behaviorProblems("ScaledObject "+so.Name, soBehavior)...)
	if d := cmp.Diff(hpa.Spec.Behavior, soBehavior); d != "" {
		problems = append(problems, fmt.Sprintf("HPA and ScaledObject behave differently (-HPA +KEDA):\n%s", d))
	}
	return problems
}

// behaviorProblems: scale-down slow and one pod at a time, so that
// sessions are not churned and each drain ends before the next.
func behaviorProblems(where string, b *autoscalingv2.HorizontalPodAutoscalerBehavior) []string {
	if b == nil || b.ScaleDown == nil {
		return []string{where + ": no scaleDown behavior (the default may remove every surplus pod at once after 5 minutes)"}
	}
	var problems []string
	down := b.ScaleDown
	if w := down.StabilizationWindowSeconds; w == nil || *w < 300 {
		problems = append(problems, fmt.Sprintf("%s: scaleDown.stabilizationWindowSeconds %s, want 300 or more (the default is 300)", where, optInt(w)))
	}
	if len(down.Policies) == 0 {
		problems = append(problems, where+": scaleDown has no policy")
	}
	for _, p := range down.Policies {
		if p.Type != autoscalingv2.PodsScalingPolicy || p.Value != 1 {
			problems = append(problems, fmt.Sprintf("%s: scaleDown policy %+v, want one pod per period", where, p))
		}
	}
	return problems
}

// Every kustomization of the recipe renders, and every object in it
// decodes strictly (the custom resources into autoscaling_types_test.go's
// copies of their types).
func TestAutoscalingRender(t *testing.T) {
	for _, dir := range autoscalingDirs {
		t.Run(dir, func(t *testing.T) {
			objs := render(t, dir)
			if len(objs) == 0 {
				t.Fatal("nothing rendered")
			}
			for _, o := range objs {
				m, err := metaOf(o)
				if err != nil {
					t.Fatal(err)
				}
				if m.GetNamespace() == "" {
					t.Errorf("%s %s has no namespace: the kustomization should set it", o.GetObjectKind().GroupVersionKind().Kind, m.GetName())
				}
			}
		})
	}
}

func optInt(p *int32) string {
	if p == nil {
		return "unset"
	}
	return strconv.Itoa(int(*p))
}

func metaOf(o runtime.Object) (metav1.Object, error) {
	m, ok := o.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no metadata", o)
	}
	return m, nil
}

// The recipe's queries read tether's real series, the HPA asks for what
// the adapter makes, KEDA asks Prometheus the same as the adapter does.
func TestAutoscalingRecipe(t *testing.T) {
	r := loadRecipe(t)
	series := tetherSeries(t)
	for _, p := range r.problems(series) {
		t.Error(p)
	}
	// What Prometheus receives for each of the HPA's metrics (README.md
	// spells out the first).
	targetLabels, _, _ := scrapeLabels(r.podMonitor)
	metrics, _ := adapterMetrics(r.adapterCM, series, targetLabels)
	for _, ms := range r.hpa.Spec.Metrics {
		em, ok := metrics[ms.External.Metric.Name]
		sel, err := metav1.LabelSelectorAsSelector(ms.External.Metric.Selector)
		if !ok || err != nil {
			continue // reported above
		}
		if q, err := em.query(r.hpa.Namespace, sel); err == nil {
			t.Logf("HPA %s/%s, metric %s: prometheus-adapter asks Prometheus %s", r.hpa.Namespace, r.hpa.Name, ms.External.Metric.Name, q)
		}
	}
}

// The checks above catch a broken recipe: each breakage below, alone, is
// reported.
func TestAutoscalingChecksCatchBreakage(t *testing.T) {
	series := tetherSeries(t)
	for _, tc := range []struct {
		name   string
		mutate func(r *recipe, series map[string][]string)
		want   string // in one of the problems
	}{
		{"tether renames tether_backend_sessions", func(_ *recipe, s map[string][]string) {
			s["tether_backend_live_sessions"] = s["tether_backend_sessions"]
			delete(s, "tether_backend_sessions")
		}, "tether_backend_sessions is not a series tether exports"},
		{"adapter rule on a misspelt series", func(r *recipe, _ map[string][]string) {
			r.adapterCM.Data["config.yaml"] = strings.Replace(r.adapterCM.Data["config.yaml"], "'tether_backend_sessions{", "'tether_backend_session{", 1)
		}, "tether_backend_session is not a series tether exports"},
		{"adapter rule names the metric differently", func(r *recipe, _ map[string][]string) {
			r.adapterCM.Data["config.yaml"] = strings.Replace(r.adapterCM.Data["config.yaml"], "as: tether_mcp_sessions", "as: mcp_sessions", 1)
		}, `external metric "tether_mcp_sessions", which no adapter rule makes`},
		{"adapter rule sums a fleet-wide count", func(r *recipe, _ map[string][]string) {
			r.adapterCM.Data["config.yaml"] = strings.Replace(r.adapterCM.Data["config.yaml"], "sum(max by (backend) (<<.Series>>{<<.LabelMatchers>>}))", "sum(<<.Series>>{<<.LabelMatchers>>})", 1)
		}, "sessions must be sum(max by (backend)"},
		{"adapter config field misspelt", func(r *recipe, _ map[string][]string) {
			r.adapterCM.Data["config.yaml"] = strings.Replace(r.adapterCM.Data["config.yaml"], "metricsQuery:", "metricQuery:", 1)
		}, "field metricQuery not found"},
		{"HPA on a metric the adapter does not make", func(r *recipe, _ map[string][]string) {
			r.hpa.Spec.Metrics[0].External.Metric.Name = "tether_sessions"
		}, `external metric "tether_sessions", which no adapter rule makes`},
		{"HPA target is a total, not per pod", func(r *recipe, _ map[string][]string) {
			r.hpa.Spec.Metrics[0].External.Target = autoscalingv2.MetricTarget{Type: autoscalingv2.ValueMetricType, Value: resource.NewQuantity(50, resource.DecimalSI)}
		}, "want AverageValue"},
		{"HPA selects a label the series lack", func(r *recipe, _ map[string][]string) {
			r.hpa.Spec.Metrics[0].External.Metric.Selector.MatchLabels = map[string]string{"service": "mcp-fetch"}
		}, `has no label "service"`},
		{"HPA on the proxy's Deployment", func(r *recipe, _ map[string][]string) {
			r.hpa.Spec.ScaleTargetRef.Name = "fetch-proxy"
		}, "scale the backends, not the proxy"},
		{"HPA scales down fast", func(r *recipe, _ map[string][]string) {
			r.hpa.Spec.Behavior.ScaleDown.StabilizationWindowSeconds = new(int32(0))
		}, "stabilizationWindowSeconds"},
		{"PodMonitor labels the Service differently", func(r *recipe, _ map[string][]string) {
			r.podMonitor.Spec.PodMetricsEndpoints[0].RelabelConfigs[0].TargetLabel = "backend_service"
		}, `has no label "tether_service"`},
		{"PodMonitor reads the wrong annotation", func(r *recipe, _ map[string][]string) {
			r.podMonitor.Spec.PodMetricsEndpoints[0].RelabelConfigs[0].SourceLabels = []string{"__meta_kubernetes_pod_annotation_tether_service"}
		}, "no relabeling copies"},
		{"PodMonitor on another port", func(r *recipe, _ map[string][]string) {
			r.podMonitor.Spec.PodMetricsEndpoints[0].Port = new("metrics")
		}, `no endpoint on port "tether-admin"`},
		{"KEDA query with a misspelt metric", func(r *recipe, _ map[string][]string) {
			r.scaledObject.Spec.Triggers[0].Metadata["query"] = strings.Replace(r.scaledObject.Spec.Triggers[0].Metadata["query"], "tether_backend_sessions", "tether_backend_session", 1)
		}, "tether_backend_session is not a series tether exports"},
		{"KEDA query of another namespace", func(r *recipe, _ map[string][]string) {
			r.scaledObject.Spec.Triggers[0].Metadata["query"] = strings.Replace(r.scaledObject.Spec.Triggers[0].Metadata["query"], `namespace="mcp-demo"`, `namespace="default"`, 1)
		}, `query selects namespace="default"`},
		{"KEDA reads an empty answer as 0", func(r *recipe, _ map[string][]string) {
			delete(r.scaledObject.Spec.Triggers[0].Metadata, "ignoreNullValues")
		}, "ignoreNullValues"},
		{"KEDA metadata key misspelt", func(r *recipe, _ map[string][]string) {
			m := r.scaledObject.Spec.Triggers[0].Metadata
			m["treshold"], m["threshold"] = m["threshold"], ""
		}, "metadata.treshold is not a key"},
		{"KEDA trigger of another type", func(r *recipe, _ map[string][]string) {
			r.scaledObject.Spec.Triggers[0].Type = "prometheus-adapter"
		}, `type "prometheus-adapter", want prometheus`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := loadRecipe(t)
			s := map[string][]string{}
			for k, v := range series {
				s[k] = v
			}
			tc.mutate(&r, s)
			problems := r.problems(s)
			t.Logf("problems:\n%s", strings.Join(problems, "\n"))
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, tc.want) }) {
				t.Errorf("no problem mentions %q; got:\n%s", tc.want, strings.Join(problems, "\n"))
			}
		})
	}
}

// The HPA, the adapter's ConfigMap and the HPA KEDA would make from the
// ScaledObject pass the real API server's validation (a server-side dry
// run: POST ?dryRun=All, strict field validation).
func TestAutoscalingDryRun(t *testing.T) {
	r := loadRecipe(t)
	env := kubetest.Start(t, kubetest.Options{})
	admin := env.AdminClient()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	for _, ns := range []string{r.hpa.Namespace, r.adapterCM.Namespace} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: metav1.FieldValidationStrict}

	if _, err := admin.AutoscalingV2().HorizontalPodAutoscalers(r.hpa.Namespace).Create(ctx, r.hpa, dryRun); err != nil {
		t.Errorf("HPA %s: %v", r.hpa.Name, err)
	}
	if _, err := admin.CoreV1().ConfigMaps(r.adapterCM.Namespace).Create(ctx, r.adapterCM, dryRun); err != nil {
		t.Errorf("ConfigMap %s: %v", r.adapterCM.Name, err)
	}
	kh, err := kedaHPA(r.scaledObject)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.AutoscalingV2().HorizontalPodAutoscalers(kh.Namespace).Create(ctx, kh, dryRun); err != nil {
		t.Errorf("the HPA KEDA makes from ScaledObject %s: %v", r.scaledObject.Name, err)
	}

	// The dry run validates (it is not a no-op): an AverageValue target
	// without its value is refused, and nothing was stored.
	broken := r.hpa.DeepCopy()
	broken.Spec.Metrics[0].External.Target.AverageValue = nil
	if _, err := admin.AutoscalingV2().HorizontalPodAutoscalers(broken.Namespace).Create(ctx, broken, dryRun); !apierrors.IsInvalid(err) {
		t.Errorf("HPA without averageValue: %v, want Invalid", err)
	}
	list, err := admin.AutoscalingV2().HorizontalPodAutoscalers(r.hpa.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 0 {
		t.Errorf("after dry runs: %d HPAs stored (%v), want none", len(list.Items), err)
	}
}

// kedaHPA is the HPA KEDA's operator makes for a ScaledObject
// (controllers/keda/hpa.go newHPAForScaledObject; each prometheus trigger
// an External metric "s<i>-prometheus" selected by the ScaledObject's
// name, its threshold the target in milli-units).
func kedaHPA(so *ScaledObject) (*autoscalingv2.HorizontalPodAutoscaler, error) {
	name := "keda-hpa-" + so.Name
	var behavior *autoscalingv2.HorizontalPodAutoscalerBehavior
	if a := so.Spec.Advanced; a != nil && a.HorizontalPodAutoscalerConfig != nil {
		behavior = a.HorizontalPodAutoscalerConfig.Behavior
		if a.HorizontalPodAutoscalerConfig.Name != "" {
			name = a.HorizontalPodAutoscalerConfig.Name
		}
	}
	minR, maxR := int32(1), int32(100)
	if so.Spec.MinReplicaCount != nil && *so.Spec.MinReplicaCount > 0 {
		minR = *so.Spec.MinReplicaCount
	}
	if so.Spec.MaxReplicaCount != nil {
		maxR = *so.Spec.MaxReplicaCount
	}
	hpa := &autoscalingv2.HorizontalPodAutoscaler{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: so.Namespace},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: so.Spec.ScaleTargetRef.Name},
			MinReplicas:    &minR,
			MaxReplicas:    maxR,
			Behavior:       behavior,
		},
	}
	for i, tr := range so.Spec.Triggers {
		th, err := strconv.ParseFloat(tr.Metadata["threshold"], 64)
		if err != nil {
			return nil, fmt.Errorf("triggers[%d] threshold: %w", i, err)
		}
		target := autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: resource.NewMilliQuantity(int64(th*1000), resource.DecimalSI)}
		if tr.MetricType == autoscalingv2.ValueMetricType {
			target = autoscalingv2.MetricTarget{Type: autoscalingv2.ValueMetricType, Value: target.AverageValue}
		}
		hpa.Spec.Metrics = append(hpa.Spec.Metrics, autoscalingv2.MetricSpec{
			Type: autoscalingv2.ExternalMetricSourceType,
			External: &autoscalingv2.ExternalMetricSource{
				Metric: autoscalingv2.MetricIdentifier{
					Name:     fmt.Sprintf("s%d-%s", i, tr.Type),
					Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"scaledobject.keda.sh/name": so.Name}},
				},
				Target: target,
			},
		})
	}
	return hpa, nil
}

// --- a PromQL reader, just enough for the recipe's queries (Prometheus'
// own parser is a heavy module): selectors and their matchers, grouping
// labels, functions.

type promSelector struct {
	name     string
	matchers [][3]string // label, op, value
}

func (s promSelector) value(label string) string {
	for _, m := range s.matchers {
		if m[0] == label && m[1] == "=" {
			return m[2]
		}
	}
	return ""
}

type promQuery struct {
	selectors []promSelector
	grouping  []string
	functions []string
}

var (
	promAggregations = []string{"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio"}
	promFunctions    = []string{"rate", "irate", "increase", "delta", "idelta", "deriv", "avg_over_time", "max_over_time", "min_over_time", "sum_over_time", "count_over_time", "last_over_time", "quantile_over_time", "histogram_quantile", "clamp", "clamp_min", "clamp_max", "abs", "ceil", "floor", "round", "vector", "scalar", "absent", "label_replace", "time"}
	promGroupings    = []string{"by", "without", "on", "ignoring", "group_left", "group_right"}
	promKeywords     = []string{"bool", "offset", "and", "or", "unless"}
	promTokenRe      = regexp.MustCompile(`^(?:(?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)|(?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`" + `)|(?P<num>[0-9][0-9.]*[a-zA-Z]*)|(?P<op>=~|!~|!=|==|>=|<=|[-+*/%^(){}\[\],=<>]))`)
)

type promToken struct{ kind, text string }

func lexPromQL(s string) ([]promToken, error) {
	var toks []promToken
	for i := 0; i < len(s); {
		if s[i] == ' ' || s[i] == '\n' || s[i] == '\t' {
			i++
			continue
		}
		m := promTokenRe.FindStringSubmatch(s[i:])
		if m == nil {
			return nil, fmt.Errorf("unexpected %q at %d", s[i:], i)
		}
		for j, name := range promTokenRe.SubexpNames() {
			if name != "" && m[j] != "" {
				toks = append(toks, promToken{name, m[j]})
				break
			}
		}
		i += len(m[0])
	}
	return toks, nil
}

func parsePromQL(s string) (promQuery, error) {
	var q promQuery
	toks, err := lexPromQL(s)
	if err != nil {
		return q, err
	}
	depth := 0
	next := func(i int) promToken {
		if i < len(toks) {
			return toks[i]
		}
		return promToken{}
	}
	for i := 0; i < len(toks); i++ {
		tk := toks[i]
		switch {
		case tk.kind == "op" && tk.text == "(":
			depth++
		case tk.kind == "op" && tk.text == ")":
			if depth--; depth < 0 {
				return q, fmt.Errorf("unbalanced ) in %q", s)
			}
		case tk.kind == "op" && tk.text == "[":
			// A range or subquery duration: skip to its end.
			for i < len(toks) && toks[i].text != "]" {
				i++
			}
			if i == len(toks) {
				return q, fmt.Errorf("unclosed [ in %q", s)
			}
		case tk.kind == "op" && tk.text == "{":
			sel, end, err := parseMatchers(toks, i, "")
			if err != nil {
				return q, fmt.Errorf("%v in %q", err, s)
			}
			q.selectors, i = append(q.selectors, sel), end
		case tk.kind == "ident" && slices.Contains(promGroupings, tk.text):
			if next(i+1).text != "(" {
				continue // group_left without labels
			}
			j := i + 2
			for ; j < len(toks) && toks[j].text != ")"; j++ {
				if toks[j].kind == "ident" {
					q.grouping = append(q.grouping, toks[j].text)
				} else if toks[j].text != "," {
					return q, fmt.Errorf("unexpected %q in %s (...) of %q", toks[j].text, tk.text, s)
				}
			}
			if j == len(toks) {
				return q, fmt.Errorf("unclosed %s ( in %q", tk.text, s)
			}
			i = j
		case tk.kind == "ident" && slices.Contains(promAggregations, tk.text), tk.kind == "ident" && slices.Contains(promKeywords, tk.text):
		case tk.kind == "ident" && next(i+1).text == "(":
			q.functions = append(q.functions, tk.text)
		case tk.kind == "ident":
			if next(i+1).text == "{" {
				sel, end, err := parseMatchers(toks, i+1, tk.text)
				if err != nil {
					return q, fmt.Errorf("%v in %q", err, s)
				}
				q.selectors, i = append(q.selectors, sel), end
			} else {
				q.selectors = append(q.selectors, promSelector{name: tk.text})
			}
		}
	}
	if depth != 0 {
		return q, fmt.Errorf("unbalanced ( in %q", s)
	}
	return q, nil
}

// parseMatchers reads {label op "value", ...} from toks[open] (the "{").
func parseMatchers(toks []promToken, open int, name string) (promSelector, int, error) {
	sel := promSelector{name: name}
	i := open + 1
	for i < len(toks) && toks[i].text != "}" {
		if i+2 >= len(toks) || toks[i].kind != "ident" || toks[i+1].kind != "op" || toks[i+2].kind != "str" {
			return sel, 0, fmt.Errorf("bad matcher at %q", toks[i].text)
		}
		op := toks[i+1].text
		if !slices.Contains([]string{"=", "!=", "=~", "!~"}, op) {
			return sel, 0, fmt.Errorf("bad matcher operator %q", op)
		}
		val, err := strconv.Unquote(toks[i+2].text)
		if err != nil {
			return sel, 0, err
		}
		if toks[i].text == "__name__" && op == "=" {
			sel.name = val
		} else {
			sel.matchers = append(sel.matchers, [3]string{toks[i].text, op, val})
		}
		i += 3
		if i < len(toks) && toks[i].text == "," {
			i++
		}
	}
	if i == len(toks) {
		return sel, 0, fmt.Errorf("unclosed {")
	}
	if sel.name == "" {
		return sel, 0, fmt.Errorf("a selector without a metric name")
	}
	return sel, i, nil
}

// check reports every metric the query reads that tether does not export,
// every label it matches or groups by that the series do not carry, and
// every function this reader does not know.
func (q promQuery) check(where string, series map[string][]string, targetLabels []string) []string {
	var problems []string
	have := slices.Clone(targetLabels)
	for _, s := range q.selectors {
		own, ok := series[s.name]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s: %s is not a series tether exports", where, s.name))
			continue
		}
		labelsOf := append(slices.Clone(targetLabels), own...)
		have = append(have, own...)
		for _, m := range s.matchers {
			if !slices.Contains(labelsOf, m[0]) {
				problems = append(problems, fmt.Sprintf("%s: %s has no label %q", where, s.name, m[0]))
			}
		}
	}
	for _, l := range q.grouping {
		if !slices.Contains(have, l) {
			problems = append(problems, fmt.Sprintf("%s: grouping by %q, which none of its series has", where, l))
		}
	}
	for _, f := range q.functions {
		if !slices.Contains(promFunctions, f) {
			problems = append(problems, fmt.Sprintf("%s: unknown function %s", where, f))
		}
	}
	return problems
}

// canonicalPromQL orders each selector's matchers, so that two queries
// that differ only in that order compare equal.
func canonicalPromQL(s string) string {
	return regexp.MustCompile(`\{[^}]*\}`).ReplaceAllStringFunc(s, func(m string) string {
		parts := strings.Split(strings.Trim(m, "{}"), ",")
		for i := range parts {
			parts[i] = strings.TrimSpace(parts[i])
		}
		sort.Strings(parts)
		return "{" + strings.Join(parts, ",") + "}"
	})
}

// The reader finds what the checks rely on.
func TestPromQLReader(t *testing.T) {
	q, err := parsePromQL(`sum(max by (backend) (tether_backend_sessions{namespace="a",tether_service=~"b|c"})) / max(tether_endpoints{state="ready"}) + sum(avg_over_time(x[2m]))`)
	if err != nil {
		t.Fatal(err)
	}
	want := promQuery{
		selectors: []promSelector{
			{"tether_backend_sessions", [][3]string{{"namespace", "=", "a"}, {"tether_service", "=~", "b|c"}}},
			{"tether_endpoints", [][3]string{{"state", "=", "ready"}}},
			{"x", nil},
		},
		grouping:  []string{"backend"},
		functions: []string{"avg_over_time"},
	}
	if d := cmp.Diff(want, q, cmp.AllowUnexported(promQuery{}, promSelector{})); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	for _, bad := range []string{`sum(x`, `x{a="b"`, `sum(x))`, `{a="b"}`, `x{a=b}`, `x[5m`} {
		if _, err := parsePromQL(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

// fencedBlocks returns the fenced code blocks of a Markdown text with
// their info string, each block's indentation (inside a list item)
// removed.
func fencedBlocks(md string) (blocks [][2]string) {
	lines := strings.Split(md, "\n")
	for i := 0; i < len(lines); i++ {
		trimmed := strings.TrimLeft(lines[i], " ")
		if !strings.HasPrefix(trimmed, "```") {
			continue
		}
		indent := len(lines[i]) - len(trimmed)
		info := strings.TrimPrefix(trimmed, "```")
		var body []string
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			l := lines[i]
			if len(l) >= indent && strings.TrimSpace(l[:indent]) == "" {
				l = l[indent:]
			}
			body = append(body, l)
		}
		blocks = append(blocks, [2]string{info, strings.Join(body, "\n")})
	}
	return blocks
}

// deploy/autoscaling/README.md repeats the recipe for those who do not
// apply its files (the Helm chart's values, a Prometheus without the
// Operator) and shows queries: the copies say what the files say, and
// the queries read tether's series.
func TestAutoscalingREADME(t *testing.T) {
	r := loadRecipe(t)
	series := tetherSeries(t)
	targetLabels, serviceLabel, problems := scrapeLabels(r.podMonitor)
	for _, p := range problems {
		t.Error(p)
	}
	var cfg adapterConfig
	if err := yaml2.UnmarshalStrict([]byte(r.adapterCM.Data["config.yaml"]), &cfg); err != nil {
		t.Fatal(err)
	}
	var podRelabel RelabelConfig
	for _, rc := range r.podMonitor.Spec.PodMetricsEndpoints[0].RelabelConfigs {
		if rc.TargetLabel == serviceLabel {
			podRelabel = rc
		}
	}

	raw, err := os.ReadFile("autoscaling/README.md")
	if err != nil {
		t.Fatal(err)
	}
	var values, scrape, queries int
	for _, b := range fencedBlocks(string(raw)) {
		info, body := b[0], b[1]
		switch {
		case info == "yaml" && strings.HasPrefix(body, "rules:"):
			values++
			var v struct {
				Rules struct {
					External []adapterRule `yaml:"external"`
				} `yaml:"rules"`
			}
			if err := yaml2.UnmarshalStrict([]byte(body), &v); err != nil {
				t.Errorf("README's Helm values: %v", err)
			}
			if d := cmp.Diff(cfg.ExternalRules, v.Rules.External); d != "" {
				t.Errorf("README's Helm values differ from prometheus-adapter/adapter-config.yaml (-file +README):\n%s", d)
			}
		case info == "yaml" && strings.HasPrefix(body, "scrape_configs:"):
			scrape++
			var v struct {
				ScrapeConfigs []struct {
					RelabelConfigs []struct {
						SourceLabels []string `yaml:"source_labels"`
						Regex        string   `yaml:"regex"`
						TargetLabel  string   `yaml:"target_label"`
						Action       string   `yaml:"action"`
					} `yaml:"relabel_configs"`
				} `yaml:"scrape_configs"`
			}
			if err := yaml2.Unmarshal([]byte(body), &v); err != nil || len(v.ScrapeConfigs) != 1 {
				t.Fatalf("README's scrape_config: %v", err)
			}
			var keepsAdmin, labels bool
			for _, rc := range v.ScrapeConfigs[0].RelabelConfigs {
				if rc.Action == "keep" && slices.Equal(rc.SourceLabels, []string{"__meta_kubernetes_pod_container_port_name"}) {
					keepsAdmin = rc.Regex == *r.podMonitor.Spec.PodMetricsEndpoints[0].Port
				}
				if rc.TargetLabel == serviceLabel {
					labels = slices.Equal(rc.SourceLabels, podRelabel.SourceLabels) && rc.Regex == podRelabel.Regex
				}
			}
			if !keepsAdmin || !labels {
				t.Errorf("README's scrape_config: keeps the PodMonitor's port %v, sets %s as the PodMonitor does %v", keepsAdmin, serviceLabel, labels)
			}
		case info == "" && strings.HasPrefix(body, "sum("):
			queries++
			q, err := parsePromQL(body)
			if err != nil {
				t.Errorf("README query: %v", err)
				continue
			}
			for _, p := range q.check("README query "+body, series, targetLabels) {
				t.Error(p)
			}
			for _, p := range querySemantics("README", strings.SplitN(body, "\n", 2)[0]) {
				t.Error(p)
			}
		}
	}
	if values != 1 || scrape != 1 || queries < 2 {
		t.Errorf("README: %d Helm values blocks, %d scrape_configs, %d queries; want 1, 1 and 2 or more", values, scrape, queries)
	}
}
