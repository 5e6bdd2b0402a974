package inject

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"mime"
	"net/http"
	"reflect"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MaxReviewBytes bounds an AdmissionReview body (413 beyond). The API
// server refuses request bodies over 3 MiB (and etcd stores objects of at
// most 1.5 MiB), and the webhook reviews Pod creations only, which carry
// no old object: a real review fits. Parsing is what costs (a 1.8 MB Pod
// of 60,000 env entries: 2 s of CPU, 220 MB allocated), so the bound is
// the API server's own, not more.
const MaxReviewBytes = 3 << 20

// The webhook: the API server sends an AdmissionReview for every Pod
// created in the namespaces the MutatingWebhookConfiguration selects; a
// Pod annotated tether.dev/inject: "true" comes back with a JSON patch that
// adds the sidecar, configured like `tether inject` (the webhook's flags,
// then the Pod's annotations).

// reviewError is a request the webhook cannot answer with a verdict (not an
// AdmissionReview, no request in it, an undecodable object). It becomes an
// HTTP error status, and the webhook's failurePolicy decides what happens
// to the Pod.
type reviewError struct {
	Status int
	Msg    string
}

func (e *reviewError) Error() string { return e.Msg }

// decision is what the webhook did with one Pod, for its log.
type decision struct {
	Pod    string // namespace/name (generateName… before a name is chosen)
	Action Action // actionInjected, actionSkipped, or "" when denied
	Detail string
}

// review answers one AdmissionReview v1 request body.
func (inj Injector) review(body []byte) (*admissionv1.AdmissionReview, decision, error) {
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil {
		return nil, decision{}, &reviewError{http.StatusBadRequest, "not an AdmissionReview: " + err.Error()}
	}
	if review.APIVersion != "admission.k8s.io/v1" || review.Kind != "AdmissionReview" {
		return nil, decision{}, &reviewError{http.StatusBadRequest, fmt.Sprintf("want an admission.k8s.io/v1 AdmissionReview, got %s %s", review.APIVersion, review.Kind)}
	}
	req := review.Request
	if req == nil || req.UID == "" {
		return nil, decision{}, &reviewError{http.StatusBadRequest, "AdmissionReview without a request (or its uid)"}
	}
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	out := &admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp}
	d := decision{Pod: req.Namespace + "/" + req.Name, Action: actionSkipped}

	if req.Kind.Group != "" || req.Kind.Kind != "Pod" || req.SubResource != "" || req.Operation != admissionv1.Create {
		d.Detail = fmt.Sprintf("%s %s%s is not a Pod creation", req.Operation, req.Kind.Kind, strings.TrimPrefix("/"+req.SubResource, "/"))
		return out, d, nil
	}
	if name, ok := notAnnotatedPod(req.Object.Raw); ok {
		if req.Name == "" {
			d.Pod = req.Namespace + "/" + name
		}
		d.Detail = "not annotated " + annotationInject + `: "true"`
		return out, d, nil
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(req.Object.Raw, &doc); err != nil || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, d, &reviewError{http.StatusBadRequest, "request.object is not a Pod"}
	}
	root := doc.Content[0]
	if req.Name == "" { // generateName: the API server names it later
		d.Pod = req.Namespace + "/" + strings.TrimPrefix(objectName(root), "pod/")
	}
	t, ok, err := findTemplate(root)
	if err != nil || !ok {
		return nil, d, &reviewError{http.StatusBadRequest, "request.object is not a Pod"}
	}
	ann := t.annotations()
	if strings.TrimSpace(strings.ToLower(ann[annotationInject])) != "true" {
		d.Detail = "not annotated " + annotationInject + `: "true"`
		return out, d, nil
	}
	if findNamed(mapGet(t.spec, "initContainers"), ContainerName) >= 0 || findNamed(mapGet(t.spec, "containers"), ContainerName) >= 0 {
		d.Detail = "it already has a container named " + ContainerName
		return out, d, nil
	}
	c, err := inj.Defaults.With(ann)
	if err == nil {
		err = c.Validate()
	}
	var res Result
	if err == nil {
		res, err = t.apply(c)
	}
	if err != nil {
		// The Pod asked for tether and cannot have it; created without it,
		// its proxy would point at a port nobody listens on. Say so where
		// the user looks (kubectl, the ReplicaSet's events).
		msg := "tether: " + strings.TrimPrefix(err.Error(), t.obj+": ")
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusBadRequest, Reason: metav1.StatusReasonBadRequest, Message: msg}
		d.Action, d.Detail = "", msg
		return out, d, nil
	}
	after, err := plain(root)
	if err != nil {
		return nil, d, err
	}
	before, err := decodeJSON(req.Object.Raw)
	if err != nil {
		return nil, d, &reviewError{http.StatusBadRequest, "request.object is not JSON"}
	}
	patch, err := json.Marshal(jsonPatch(before, after))
	if err != nil {
		return nil, d, err
	}
	pt := admissionv1.PatchTypeJSONPatch
	resp.Patch, resp.PatchType = patch, &pt
	if res.Detail != "" {
		resp.Warnings = []string{"tether: " + res.Detail}
	}
	d.Action, d.Detail = actionInjected, res.Detail
	return out, d, nil
}

// notAnnotatedPod reports whether raw is a Pod without tether.dev/inject:
// "true", reading its metadata only: most Pods of a namespace are not
// annotated, and need not be parsed whole (as a YAML tree, which for a
// large Pod costs seconds). name is the Pod's name, or its generateName
// followed by "…". Anything else (another kind, a malformed object) is
// left to the full parse and its errors.
func notAnnotatedPod(raw []byte) (name string, ok bool) {
	var obj struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name         string            `json:"name"`
			GenerateName string            `json:"generateName"`
			Annotations  map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || obj.APIVersion != "v1" || obj.Kind != "Pod" {
		return "", false
	}
	if strings.TrimSpace(strings.ToLower(obj.Metadata.Annotations[annotationInject])) == "true" {
		return "", false
	}
	name = obj.Metadata.Name
	if name == "" && obj.Metadata.GenerateName != "" {
		name = obj.Metadata.GenerateName + "…"
	}
	return name, true
}

// patchOp is one RFC 6902 operation.
type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// jsonPatch turns before into after, member by member two levels deep
// (injection changes members of spec: initContainers, containers,
// terminationGracePeriodSeconds). "add" of an existing member replaces it.
func jsonPatch(before, after any) []patchOp {
	var ops []patchOp
	var diff func(path string, b, a map[string]any, depth int)
	diff = func(path string, b, a map[string]any, depth int) {
		for _, k := range slices.Sorted(maps.Keys(b)) {
			if _, ok := a[k]; !ok {
				ops = append(ops, patchOp{Op: "remove", Path: path + "/" + escapePointer(k)})
			}
		}
		for _, k := range slices.Sorted(maps.Keys(a)) {
			av, bv := a[k], b[k]
			if reflect.DeepEqual(av, bv) {
				continue
			}
			am, aIsMap := av.(map[string]any)
			bm, bIsMap := bv.(map[string]any)
			if depth < 2 && aIsMap && bIsMap {
				diff(path+"/"+escapePointer(k), bm, am, depth+1)
				continue
			}
			ops = append(ops, patchOp{Op: "add", Path: path + "/" + escapePointer(k), Value: av})
		}
	}
	b, _ := before.(map[string]any)
	a, _ := after.(map[string]any)
	diff("", b, a, 1)
	return ops
}

// escapePointer escapes a JSON Pointer token (RFC 6901).
func escapePointer(s string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
}

// AdmissionHandler serves AdmissionReview requests (POST, JSON). Injections
// are logged at info, denials and refused reviews at warn, skips at debug.
func (inj Injector) AdmissionHandler(log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "POST an AdmissionReview", http.StatusMethodNotAllowed)
			return
		}
		if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
			http.Error(w, "want Content-Type: application/json", http.StatusUnsupportedMediaType)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxReviewBytes))
		if err != nil {
			status := http.StatusBadRequest
			if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
				status = http.StatusRequestEntityTooLarge
			}
			http.Error(w, err.Error(), status)
			return
		}
		review, d, err := inj.review(body)
		if err != nil {
			status := http.StatusInternalServerError
			if re, ok := errors.AsType[*reviewError](err); ok {
				status = re.Status
			}
			log.Warn("admission review refused", "status", status, "err", err)
			http.Error(w, err.Error(), status)
			return
		}
		switch d.Action {
		case "":
			log.Warn("pod denied", "pod", d.Pod, "reason", d.Detail)
		case actionSkipped:
			log.Debug("pod skipped", "pod", d.Pod, "reason", d.Detail)
		default:
			log.Info("pod "+string(d.Action), "pod", d.Pod, "detail", d.Detail)
		}
		out, err := json.Marshal(review)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(out)
	})
}
