package inject

import (
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// workload says where a kind keeps its pod template.
type workload struct {
	group string   // API group of apiVersion ("" for the core group)
	path  []string // keys from the object to the pod template; nil: the object is a Pod
	// finite: its pods run to completion, so a classic sidecar (which never
	// exits) would keep them from ever finishing.
	finite bool
}

// workloads are the kinds injection supports.
var workloads = map[string]workload{
	"Pod":                   {group: "", finite: false},
	"Deployment":            {group: "apps", path: []string{"spec", "template"}},
	"StatefulSet":           {group: "apps", path: []string{"spec", "template"}},
	"DaemonSet":             {group: "apps", path: []string{"spec", "template"}},
	"ReplicaSet":            {group: "apps", path: []string{"spec", "template"}},
	"ReplicationController": {group: "", path: []string{"spec", "template"}},
	"Job":                   {group: "batch", path: []string{"spec", "template"}, finite: true},
	"CronJob":               {group: "batch", path: []string{"spec", "jobTemplate", "spec", "template"}, finite: true},
}

// supportedKinds lists the kinds in the order messages name them.
var supportedKinds = []string{"Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "ReplicationController", "Job", "CronJob"}

// Action is what injection did to one object.
type Action string

const (
	actionInjected  Action = "injected"  // the sidecar was added
	actionUpdated   Action = "updated"   // an existing tether container (or the grace period) was rewritten
	actionUnchanged Action = "unchanged" // already as desired
	actionSkipped   Action = "skipped"   // not a workload, or opted out
)

// Result reports one object.
type Result struct {
	Object string // kind/name, as kubectl prints it
	Action Action
	// Detail says why an object was skipped, and warns about settings that
	// keep tether from working (no service-account token).
	Detail string
}

// errUnknownKind is wrapped by errors for objects that carry a pod template
// but are of a kind injection does not know.
var errUnknownKind = errors.New("unknown kind")

// template is one pod template inside an object.
type template struct {
	obj  string       // kind/name for messages
	kind workload     // the kind's facts
	ann  []*yaml.Node // annotation mappings that configure it, weakest first
	meta *yaml.Node   // the pod's metadata (may be nil)
	spec *yaml.Node   // the PodSpec
}

// objectName is kind/name (generateName… when the name is not chosen yet).
func objectName(root *yaml.Node) string {
	kind := scalar(mapGet(root, "kind"))
	name := scalar(mapPath(root, "metadata", "name"))
	if name == "" {
		if g := scalar(mapPath(root, "metadata", "generateName")); g != "" {
			name = g + "…"
		}
	}
	return strings.ToLower(kind) + "/" + name
}

// findTemplate locates the pod template of root. ok is false for objects
// without one (Services, ConfigMaps, ...); an error means a pod template of
// an unknown kind, or a supported kind without its template.
func findTemplate(root *yaml.Node) (t template, ok bool, err error) {
	kind := scalar(mapGet(root, "kind"))
	apiVersion := scalar(mapGet(root, "apiVersion"))
	group, _, hasGroup := strings.Cut(apiVersion, "/")
	if !hasGroup {
		group = ""
	}
	t.obj = objectName(root)
	w, known := workloads[kind]
	if !known || w.group != group {
		if looksLikeWorkload(root) {
			return t, false, fmt.Errorf("%s (%s): %w: it has a pod template, but tether inject knows only %s (the sidecar can be added by hand: deploy/components/sidecar)",
				t.obj, apiVersion, errUnknownKind, strings.Join(supportedKinds, ", "))
		}
		return t, false, nil
	}
	t.kind = w
	t.ann = []*yaml.Node{mapPath(root, "metadata", "annotations")}
	if w.path == nil {
		t.meta, t.spec = mapGet(root, "metadata"), mapGet(root, "spec")
	} else {
		tmpl := mapPath(root, w.path...)
		t.meta, t.spec = mapGet(tmpl, "metadata"), mapGet(tmpl, "spec")
		t.ann = append(t.ann, mapGet(t.meta, "annotations"))
	}
	if t.spec == nil || t.spec.Kind != yaml.MappingNode {
		where := "spec"
		if w.path != nil {
			where = strings.Join(w.path, ".") + ".spec"
		}
		return t, false, fmt.Errorf("%s: no %s", t.obj, where)
	}
	return t, true, nil
}

// looksLikeWorkload reports whether an object of an unknown kind carries a
// pod template (or is pod-shaped), which injection would silently miss.
func looksLikeWorkload(root *yaml.Node) bool {
	return mapPath(root, "spec", "template", "spec", "containers") != nil ||
		mapPath(root, "spec", "jobTemplate") != nil ||
		mapPath(root, "spec", "containers") != nil
}

// annotations merges the template's annotation mappings, the pod's own
// winning over its workload's.
func (t template) annotations() map[string]string {
	out := map[string]string{}
	for _, a := range t.ann {
		maps.Copy(out, stringMap(a))
	}
	return out
}

// optedOut reports tether.dev/inject: "false".
func (t template) optedOut() bool {
	return strings.EqualFold(strings.TrimSpace(t.annotations()[annotationInject]), "false")
}

// apply makes the pod template carry the sidecar of c (valid). It reports
// what it did.
func (t template) apply(c Config) (Result, error) {
	res := Result{Object: t.obj}
	if c.Legacy && t.kind.finite || c.Legacy && t.kind.path == nil && isFinitePod(t.spec) {
		return res, fmt.Errorf("%s: %w", t.obj, ErrLegacyFinite)
	}
	want, err := toNode(c.Container())
	if err != nil {
		return res, err
	}
	wantPlain, err := plain(want)
	if err != nil {
		return res, err
	}

	inits := deref(mapGet(t.spec, "initContainers"))
	ctrs := deref(mapGet(t.spec, "containers"))
	if ctrs == nil || ctrs.Kind != yaml.SequenceNode {
		return res, fmt.Errorf("%s: the pod has no containers", t.obj)
	}
	if inits != nil && inits.Kind != yaml.SequenceNode {
		return res, fmt.Errorf("%s: initContainers is not a list", t.obj)
	}

	// target is the list tether belongs in, other the one it must leave.
	target, other := inits, ctrs
	if c.Legacy {
		target, other = ctrs, inits
	}
	existed := false
	changed := false
	if i := findNamed(other, ContainerName); i >= 0 {
		other.Content = append(other.Content[:i:i], other.Content[i+1:]...)
		existed, changed = true, true
		if other == inits && len(inits.Content) == 0 {
			mapDelete(t.spec, "initContainers")
		}
	}
	if target == nil {
		target = &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		mapSet(t.spec, "initContainers", target, "containers")
	}
	if i := findNamed(target, ContainerName); i >= 0 {
		existed = true
		have, err := plain(target.Content[i])
		if err != nil {
			return res, err
		}
		if !covers(have, wantPlain) {
			want.HeadComment = target.Content[i].HeadComment
			target.Content[i] = want
			changed = true
		}
	} else if c.Legacy {
		target.Content = append(target.Content, want)
		changed = true
	} else {
		// First: it starts before every other container and stops last.
		target.Content = append([]*yaml.Node{want}, target.Content...)
		changed = true
	}

	if grace := c.terminationGrace(); currentGrace(t.spec) < grace {
		mapSet(t.spec, "terminationGracePeriodSeconds",
			&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.FormatInt(grace, 10)}, "")
		changed = true
	}

	switch {
	case !changed:
		res.Action = actionUnchanged
	case existed:
		res.Action = actionUpdated
	default:
		res.Action = actionInjected
	}
	if scalar(mapGet(t.spec, "automountServiceAccountToken")) == "false" {
		res.Detail = "warning: automountServiceAccountToken is false, so tether has no token to read EndpointSlices with; mount one"
	}
	return res, nil
}

// currentGrace is the pod's termination grace (the API's default is 30).
func currentGrace(spec *yaml.Node) int64 {
	v := scalar(mapGet(spec, "terminationGracePeriodSeconds"))
	if v == "" {
		return 30
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 30
	}
	return n
}

// isFinitePod: a bare Pod whose containers are not restarted runs to
// completion.
func isFinitePod(spec *yaml.Node) bool {
	p := scalar(mapGet(spec, "restartPolicy"))
	return p == "Never" || p == "OnFailure"
}

// injectObject injects into one object (a root mapping). ok is false when
// it has no pod template.
func (inj Injector) injectObject(root *yaml.Node) (Result, error) {
	t, ok, err := findTemplate(root)
	if err != nil {
		return Result{Object: t.obj}, err
	}
	if !ok {
		return Result{Object: objectName(root), Action: actionSkipped, Detail: "no pod template"}, nil
	}
	if t.optedOut() {
		return Result{Object: t.obj, Action: actionSkipped, Detail: annotationInject + ": \"false\""}, nil
	}
	c, err := inj.Defaults.With(t.annotations())
	if err == nil {
		err = c.Validate()
	}
	if err != nil {
		return Result{Object: t.obj}, fmt.Errorf("%s: %w", t.obj, err)
	}
	return t.apply(c)
}

// Injector adds the sidecar with Defaults, overridden per object by its
// annotations.
type Injector struct {
	Defaults Config
}
