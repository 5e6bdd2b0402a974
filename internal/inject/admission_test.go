package inject

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	goruntime "runtime"
	"strings"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

var podGVK = metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}
var podGVR = metav1.GroupVersionResource{Version: "v1", Resource: "pods"}

func testPod(ann map[string]string) *corev1.Pod {
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{GenerateName: "proxy-7d9f-", Namespace: "tools", Annotations: ann},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "setup", Image: "busybox"}},
			Containers:     []corev1.Container{{Name: "proxy", Image: "example/proxy:1"}},
		},
	}
}

// reviewFor wraps obj in an AdmissionReview v1 request.
func reviewFor(t *testing.T, op admissionv1.Operation, kind metav1.GroupVersionKind, obj any) []byte {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	r := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: types.UID("0d2a-uid"), Kind: kind, Resource: podGVR, Namespace: "tools",
			Operation: op, Object: runtime.RawExtension{Raw: raw},
		},
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var injectAnnotations = map[string]string{annotationInject: "true", AnnotationService: "mcp-fetch"}

func TestReviewPatched(t *testing.T) {
	inj := Injector{Defaults: testConfig()}
	pod := testPod(injectAnnotations)
	review, d, err := inj.review(reviewFor(t, admissionv1.Create, podGVK, pod))
	if err != nil {
		t.Fatal(err)
	}
	resp := review.Response
	if review.APIVersion != "admission.k8s.io/v1" || review.Kind != "AdmissionReview" || resp.UID != "0d2a-uid" {
		t.Fatalf("review header %s %s uid %q", review.APIVersion, review.Kind, resp.UID)
	}
	if !resp.Allowed || resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch || d.Action != actionInjected {
		t.Fatalf("allowed %v patch type %v action %q", resp.Allowed, resp.PatchType, d.Action)
	}
	if d.Pod != "tools/proxy-7d9f-…" {
		t.Errorf("decision names %q", d.Pod)
	}

	// The patch, applied as the API server would, gives the sidecar first
	// among the init containers, and only that.
	raw, _ := json.Marshal(pod)
	patch, err := jsonpatch.DecodePatch(resp.Patch)
	if err != nil {
		t.Fatalf("patch %s: %v", resp.Patch, err)
	}
	patched, err := patch.Apply(raw)
	if err != nil {
		t.Fatalf("patch %s: %v", resp.Patch, err)
	}
	var got corev1.Pod
	dec := json.NewDecoder(bytes.NewReader(patched))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.InitContainers) != 2 || got.Spec.InitContainers[0].Name != ContainerName || got.Spec.InitContainers[1].Name != "setup" {
		t.Fatalf("init containers %+v", got.Spec.InitContainers)
	}
	tc := got.Spec.InitContainers[0]
	if tc.RestartPolicy == nil || *tc.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("tether is not a native sidecar: %+v", tc.RestartPolicy)
	}
	if !strings.Contains(strings.Join(tc.Args, " "), "--k8s-service=$(POD_NAMESPACE)/mcp-fetch") {
		t.Errorf("args %q", tc.Args)
	}
	if g := got.Spec.TerminationGracePeriodSeconds; g == nil || *g != 45 {
		t.Errorf("terminationGracePeriodSeconds %v, want 45", g)
	}
	// Nothing else moved.
	got.Spec.InitContainers = got.Spec.InitContainers[1:]
	got.Spec.TerminationGracePeriodSeconds = nil
	want, _ := json.Marshal(pod)
	have, _ := json.Marshal(&got)
	if !bytes.Equal(want, have) {
		t.Errorf("patch changed more than tether's fields:\n%s\n%s", want, have)
	}
}

func TestReviewAllowedUnchanged(t *testing.T) {
	inj := Injector{Defaults: testConfig()}
	injected := testPod(injectAnnotations)
	injected.Spec.Containers = append(injected.Spec.Containers, corev1.Container{Name: ContainerName, Image: "mine"})
	for name, body := range map[string][]byte{
		"not annotated":      reviewFor(t, admissionv1.Create, podGVK, testPod(nil)),
		"annotated false":    reviewFor(t, admissionv1.Create, podGVK, testPod(map[string]string{annotationInject: "false", AnnotationService: "s"})),
		"update":             reviewFor(t, admissionv1.Update, podGVK, testPod(injectAnnotations)),
		"not a pod":          reviewFor(t, admissionv1.Create, metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}, map[string]any{"kind": "Deployment"}),
		"already has tether": reviewFor(t, admissionv1.Create, podGVK, injected),
	} {
		t.Run(name, func(t *testing.T) {
			review, d, err := inj.review(body)
			if err != nil {
				t.Fatal(err)
			}
			if r := review.Response; !r.Allowed || r.Patch != nil || r.PatchType != nil || r.UID != "0d2a-uid" {
				t.Fatalf("response %+v", r)
			}
			if d.Action != actionSkipped || d.Detail == "" {
				t.Errorf("decision %+v", d)
			}
		})
	}
}

func TestReviewDenied(t *testing.T) {
	inj := Injector{Defaults: testConfig()}
	for name, ann := range map[string]map[string]string{
		"no service":         {annotationInject: "true"},
		"unknown annotation": {annotationInject: "true", AnnotationService: "s", "tether.dev/balance": "p2c"},
		"bad balancer":       {annotationInject: "true", AnnotationService: "s", AnnotationBalancer: "fastest"},
		"bad cpu limit":      {annotationInject: "true", AnnotationService: "s", AnnotationCPULimit: "two"},
		"zero cpu limit":     {annotationInject: "true", AnnotationService: "s", AnnotationCPULimit: "0"},
	} {
		t.Run(name, func(t *testing.T) {
			review, d, err := inj.review(reviewFor(t, admissionv1.Create, podGVK, testPod(ann)))
			if err != nil {
				t.Fatal(err)
			}
			r := review.Response
			if r.Allowed || r.Patch != nil || r.Result == nil || r.Result.Code != 400 || !strings.HasPrefix(r.Result.Message, "tether: ") {
				t.Fatalf("response %+v result %+v", r, r.Result)
			}
			if d.Action != "" {
				t.Errorf("decision %+v", d)
			}
		})
	}
}

func TestReviewMalformed(t *testing.T) {
	inj := Injector{Defaults: testConfig()}
	noRequest, _ := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"}})
	v1beta1 := bytes.Replace(reviewFor(t, admissionv1.Create, podGVK, testPod(nil)), []byte("admission.k8s.io/v1"), []byte("admission.k8s.io/v1beta1"), 1)
	notPod := reviewFor(t, admissionv1.Create, podGVK, []int{1, 2})
	for name, body := range map[string][]byte{
		"not JSON":     []byte("{"),
		"no request":   noRequest,
		"v1beta1":      v1beta1,
		"object array": notPod,
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := inj.review(body)
			re, ok := errors.AsType[*reviewError](err)
			if !ok || re.Status != http.StatusBadRequest {
				t.Fatalf("error %v, want a 400 reviewError", err)
			}
		})
	}
}

func TestAdmissionHandler(t *testing.T) {
	srv := httptest.NewServer(Injector{Defaults: testConfig()}.AdmissionHandler(nil))
	defer srv.Close()
	post := func(ct string, body []byte) *http.Response {
		t.Helper()
		resp, err := http.Post(srv.URL, ct, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	good := reviewFor(t, admissionv1.Create, podGVK, testPod(injectAnnotations))

	resp := post("application/json", good)
	var review admissionv1.AdmissionReview
	if err := json.NewDecoder(resp.Body).Decode(&review); err != nil || resp.StatusCode != 200 || review.Response == nil || review.Response.Patch == nil {
		t.Fatalf("status %d err %v review %+v", resp.StatusCode, err, review)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	if got := post("text/plain", good).StatusCode; got != http.StatusUnsupportedMediaType {
		t.Errorf("text/plain: %d", got)
	}
	if got := post("application/json", []byte("nope")).StatusCode; got != http.StatusBadRequest {
		t.Errorf("malformed: %d", got)
	}
	if got := post("application/json", bytes.Repeat([]byte(" "), MaxReviewBytes+1)).StatusCode; got != http.StatusRequestEntityTooLarge {
		t.Errorf("too large: %d", got)
	}
	get, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	get.Body.Close()
	if get.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d", get.StatusCode)
	}
}

func TestJSONPatchEscapes(t *testing.T) {
	before := map[string]any{"metadata": map[string]any{"annotations": map[string]any{"a/b~c": "1"}}, "gone": json.Number("1")}
	after := map[string]any{"metadata": map[string]any{"annotations": map[string]any{"a/b~c": "2"}}}
	got, _ := json.Marshal(jsonPatch(before, after))
	want := `[{"op":"remove","path":"/gone"},{"op":"add","path":"/metadata/annotations","value":{"a/b~c":"2"}}]`
	if string(got) != want {
		t.Errorf("patch %s\nwant  %s", got, want)
	}
}

// A Pod that does not ask for tether is skipped from its metadata alone:
// a large Pod is not parsed whole (old main built a YAML tree of every
// Pod: 61 MB allocated and 0.6 s for one of 1.8 MB).
func TestReviewSkipsUnannotatedPodCheaply(t *testing.T) {
	inj := Injector{Defaults: testConfig()}
	pod := testPod(map[string]string{"team": "tools"})
	for i := range 60000 {
		pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env, corev1.EnvVar{Name: fmt.Sprintf("V%d", i), Value: "x"})
	}
	body := reviewFor(t, admissionv1.Create, podGVK, pod)
	var before, after goruntime.MemStats
	goruntime.ReadMemStats(&before)
	review, d, err := inj.review(body)
	goruntime.ReadMemStats(&after)
	if err != nil || !review.Response.Allowed || review.Response.Patch != nil || d.Action != actionSkipped || d.Pod != "tools/proxy-7d9f-…" {
		t.Fatalf("review: %v, action %q pod %q", err, d.Action, d.Pod)
	}
	if allocated := after.TotalAlloc - before.TotalAlloc; allocated > 4*uint64(len(body)) {
		t.Errorf("%d MB allocated to skip a %d MB review", allocated>>20, len(body)>>20)
	}
}

// tether.dev/cpu-limit reaches the Pod the API server creates: the
// sidecar's CPU limit, and GOMAXPROCS from it; a limit the API server
// would refuse is denied with the annotation's name.
func TestReviewCPULimit(t *testing.T) {
	inj := Injector{Defaults: testConfig()}
	pod := testPod(map[string]string{annotationInject: "true", AnnotationService: "mcp-fetch", AnnotationCPULimit: "500m"})
	review, _, err := inj.review(reviewFor(t, admissionv1.Create, podGVK, pod))
	if err != nil {
		t.Fatal(err)
	}
	if !review.Response.Allowed {
		t.Fatalf("denied: %+v", review.Response.Result)
	}
	raw, _ := json.Marshal(pod)
	patch, err := jsonpatch.DecodePatch(review.Response.Patch)
	if err != nil {
		t.Fatal(err)
	}
	patched, err := patch.Apply(raw)
	if err != nil {
		t.Fatal(err)
	}
	var got corev1.Pod
	if err := json.Unmarshal(patched, &got); err != nil {
		t.Fatal(err)
	}
	tc := got.Spec.InitContainers[0]
	if tc.Name != ContainerName {
		t.Fatalf("first init container %q", tc.Name)
	}
	var procs []string
	for _, e := range tc.Env {
		if e.Name == "GOMAXPROCS" {
			procs = append(procs, e.Value)
		}
	}
	if len(procs) != 1 || procs[0] != "1" {
		t.Errorf("GOMAXPROCS %q, want [1] for a limit of 500m", procs)
	}
	if q := tc.Resources.Limits.Cpu(); q.String() != "500m" {
		t.Errorf("CPU limit %s, want 500m", q)
	}

	// Below the sidecar's CPU request (50m): the API server would refuse
	// the Pod; the webhook says why, naming the setting.
	pod = testPod(map[string]string{annotationInject: "true", AnnotationService: "mcp-fetch", AnnotationCPULimit: "20m"})
	review, _, err = inj.review(reviewFor(t, admissionv1.Create, podGVK, pod))
	if err != nil {
		t.Fatal(err)
	}
	if r := review.Response; r.Allowed || r.Result == nil || !strings.Contains(r.Result.Message, "cpu-limit") {
		t.Fatalf("a limit below the request: allowed %v, result %+v", r.Allowed, r.Result)
	}
}
