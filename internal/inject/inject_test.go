package inject

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"
	sigsyaml "sigs.k8s.io/yaml"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// testConfig is what the golden files were made with: no Service (it comes
// from an annotation or the case's "flags").
func testConfig() Config {
	c := DefaultConfig("v1.0.0")
	return c
}

// The golden cases: testdata/NAME.yaml goes in; testdata/NAME.golden.yaml
// is the output, or testdata/NAME.err the error.
var goldenCases = []struct {
	name  string
	input string // testdata file; default name
	flags func(*Config)
	want  []string // "object action" per object
}{
	{name: "deployment", want: []string{"deployment/fetch-proxy injected"}},
	{name: "statefulset", flags: withService, want: []string{"statefulset/gateway injected"}},
	{name: "daemonset", flags: withService, want: []string{"daemonset/node-proxy injected"}},
	{name: "replicaset", flags: withService, want: []string{"replicaset/proxy-rs injected"}},
	{name: "replicationcontroller", flags: withService, want: []string{"replicationcontroller/proxy-rc injected"}},
	{name: "job", flags: withService, want: []string{"job/crawl injected"}},
	{name: "cronjob", flags: withService, want: []string{"cronjob/nightly injected"}},
	{name: "pod", want: []string{"pod/debug-proxy injected"}},
	{name: "multi", flags: withService, want: []string{
		"serviceaccount/fetch-proxy skipped", "service/fetch-proxy skipped", "deployment/fetch-proxy injected",
		"configmap/settings skipped", "deployment/second injected",
	}},
	{name: "optout", flags: withService, want: []string{"deployment/not-me skipped"}},
	{name: "json", want: []string{"deployment/from-json injected"}},
	{name: "upgrade", want: []string{"deployment/old updated"}},
	{name: "legacy", flags: func(c *Config) { c.Legacy = true }, want: []string{"deployment/classic injected"}},
	{name: "legacy-no-prestop", input: "legacy", flags: func(c *Config) { c.Legacy, c.PreStopSleep = true, 0 }, want: []string{"deployment/classic injected"}},
	{name: "redis-flag", input: "daemonset", flags: func(c *Config) {
		c.Service, c.RedisURLSecret, c.Port, c.ShutdownGrace = "tools/mcp", "redis-creds", "8080", 40*time.Second
	}, want: []string{"daemonset/node-proxy injected"}},
	{name: "cpu-limit", want: []string{"deployment/busy-proxy injected"}},
	// Errors.
	{name: "unknown-kind", flags: withService},
	{name: "bad-annotation"},
	{name: "bad-cpu-limit"},
	{name: "not-an-object"},
	{name: "no-service", input: "daemonset"},
	{name: "job-legacy", input: "job", flags: func(c *Config) { withService(c); c.Legacy = true }},
	{name: "bad-flag", input: "daemonset", flags: func(c *Config) { withService(c); c.Balancer = "fastest" }},
}

func withService(c *Config) { c.Service = "mcp-backend" }

func TestGolden(t *testing.T) {
	for _, tc := range goldenCases {
		t.Run(tc.name, func(t *testing.T) {
			input := tc.input
			if input == "" {
				input = tc.name
			}
			src, err := os.ReadFile(filepath.Join("testdata", input+".yaml"))
			if err != nil {
				t.Fatal(err)
			}
			cfg := testConfig()
			if tc.flags != nil {
				tc.flags(&cfg)
			}
			inj := Injector{Defaults: cfg}
			out, results, err := inj.Stream(src)
			if tc.want == nil {
				if err == nil {
					t.Fatalf("no error; output:\n%s", out)
				}
				golden(t, tc.name+".err", []byte(err.Error()+"\n"))
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			golden(t, tc.name+".golden.yaml", out)
			var got []string
			for _, r := range results {
				got = append(got, r.Object+" "+string(r.Action))
			}
			if d := cmp.Diff(got, tc.want); d != "" {
				t.Errorf("results (-got +want):\n%s", d)
			}

			// Idempotent: a second run writes the same bytes and changes
			// no object.
			again, results2, err := inj.Stream(out)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(again, out) {
				t.Errorf("second run changed the output:\n%s", cmp.Diff(string(out), string(again)))
			}
			for _, r := range results2 {
				if r.Action != actionUnchanged && r.Action != actionSkipped {
					t.Errorf("second run: %s %s", r.Object, r.Action)
				}
			}

			// Only what tether owns changed, and the output is valid for
			// the real API types (strictly: no unknown or duplicate field).
			onlyOwnedChanged(t, src, out)
			decodeStrict(t, out)
		})
	}
}

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./inject -update to create it)", err)
	}
	if d := cmp.Diff(string(want), string(got)); d != "" {
		t.Errorf("%s differs (-want +got; go test ./inject -update rewrites it):\n%s", path, d)
	}
}

// onlyOwnedChanged compares in and out document by document after taking
// away what injection owns: the tether container and the grace period.
func onlyOwnedChanged(t *testing.T, in, out []byte) {
	t.Helper()
	a, b := splitDocuments(in), splitDocuments(out)
	if len(a) != len(b) {
		t.Fatalf("%d documents in, %d out", len(a), len(b))
	}
	for i := range a {
		var x, y any
		if err := sigsyaml.Unmarshal([]byte(a[i].body), &x); err != nil {
			t.Fatal(err)
		}
		if err := sigsyaml.Unmarshal([]byte(b[i].body), &y); err != nil {
			t.Fatal(err)
		}
		stripOwned(x)
		stripOwned(y)
		if d := cmp.Diff(x, y); d != "" {
			t.Errorf("document %d: injection changed more than its own fields (-in +out):\n%s", i+1, d)
		}
	}
}

func stripOwned(v any) {
	switch v := v.(type) {
	case map[string]any:
		if _, ok := v["containers"]; ok {
			delete(v, "terminationGracePeriodSeconds")
			for _, key := range []string{"containers", "initContainers"} {
				list, _ := v[key].([]any)
				var kept []any
				for _, c := range list {
					if m, _ := c.(map[string]any); m["name"] != ContainerName {
						kept = append(kept, c)
					}
				}
				if len(kept) == 0 && key == "initContainers" {
					delete(v, key)
				} else if v[key] != nil {
					v[key] = kept
				}
			}
		}
		for _, c := range v {
			stripOwned(c)
		}
	case []any:
		for _, c := range v {
			stripOwned(c)
		}
	}
}

// decodeStrict decodes every document into client-go's types, failing on
// unknown and duplicate fields.
func decodeStrict(t *testing.T, stream []byte) {
	t.Helper()
	dec := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	for _, ch := range splitDocuments(stream) {
		if strings.TrimSpace(stripComments(ch.body)) == "" {
			continue
		}
		js, err := sigsyaml.YAMLToJSON([]byte(ch.body))
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := dec.Decode(js, nil, nil); err != nil {
			t.Errorf("line %d: %v", ch.line, err)
		}
	}
}

func stripComments(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func TestUnknownKindIsTyped(t *testing.T) {
	src, err := os.ReadFile("testdata/unknown-kind.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = Injector{Defaults: testConfig()}.Stream(src)
	if !errors.Is(err, errUnknownKind) {
		t.Fatalf("error %v, want errUnknownKind", err)
	}
}

func TestSplitDocuments(t *testing.T) {
	src := "a: 1\n---\nb: |\n  ---not a marker\n--- # c\n...\n---\n"
	var got []string
	for _, c := range splitDocuments([]byte(src)) {
		got = append(got, c.sep+"|"+c.body)
	}
	want := []string{"|a: 1\n", "---\n|b: |\n  ---not a marker\n", "--- # c\n|...\n", "---\n|"}
	if d := cmp.Diff(got, want); d != "" {
		t.Fatalf("(-got +want):\n%s", d)
	}
}

func TestLayout(t *testing.T) {
	for _, tc := range []struct {
		src     string
		indent  int
		compact bool
	}{
		{"a:\n  b: 1\nl:\n- x\n", 2, true},
		{"a:\n    b: 1\nl:\n    - x\n", 4, false},
		{"l:\n  - x\n", 2, false},
		{"a: {b: 1}\n", 2, true},
	} {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(tc.src), &doc); err != nil {
			t.Fatal(err)
		}
		indent, compact := layout(doc.Content[0])
		if indent != tc.indent || compact != tc.compact {
			t.Errorf("%q: layout %d %v, want %d %v", tc.src, indent, compact, tc.indent, tc.compact)
		}
	}
}

func TestConfigWith(t *testing.T) {
	base := testConfig()
	got, err := base.With(map[string]string{
		AnnotationService: " tools/mcp ", AnnotationShutdownGrace: "1m", "other.io/x": "ignored",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := base
	want.Service, want.ShutdownGrace = "tools/mcp", time.Minute
	if !reflect.DeepEqual(got, want) {
		t.Errorf("With: got %+v, want %+v", got, want)
	}
	if _, err := base.With(map[string]string{AnnotationShutdownGrace: "soon"}); err == nil {
		t.Error("bad duration accepted")
	}
	for _, bad := range []Config{
		{Image: "i", Service: "Bad_Name"},
		{Image: "i", Service: "a/b/c"},
		{Image: "i", Service: "s", Port: "0"},
		{Image: "i", Service: "s", RedisURLSecret: "a/b/c"},
		{Image: "i", Service: "s", SessionTTL: "-1s"},
		{Image: "i", Service: "s", LogLevel: "loud"},
		{Image: "i", Service: "s", CPURequest: "lots"},
		{Image: "i", Service: "s", CPULimit: "lots"},
		{Image: "i", Service: "s", CPULimit: "0"},
		{Image: "i", Service: "s", CPULimit: "-1"},
		{Image: "i", Service: "s", CPURequest: "1", CPULimit: "500m"},
		{Service: "s"},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v: valid", bad)
		}
	}
	if g := base; g.terminationGrace() != 45 {
		t.Errorf("terminationGrace = %d, want 45", g.terminationGrace())
	}
	for d, want := range map[time.Duration]string{25 * time.Second: "25s", 90 * time.Second: "1m30s", time.Hour: "1h", 2 * time.Minute: "2m", 1500 * time.Millisecond: "1.5s"} {
		if got := formatDuration(d); got != want {
			t.Errorf("formatDuration(%s) = %q, want %q", d, got, want)
		}
	}
}

// A CPU limit sets the container's limit and its GOMAXPROCS, the limit in
// whole CPUs rounded up (Linkerd's ToWholeCPUCores): 1 for a core or
// less, where the Go runtime's own default under a limit is 2 at least.
func TestCPULimit(t *testing.T) {
	for limit, want := range map[string]string{"1m": "1", "500m": "1", "1": "1", "1000m": "1", "1001m": "2", "1.5": "2", "4": "4"} {
		c := testConfig()
		c.Service, c.CPULimit, c.CPURequest = "s", limit, "1m"
		if err := c.Validate(); err != nil {
			t.Errorf("cpu-limit %s: %v", limit, err)
			continue
		}
		ctr := c.Container()
		var got []string
		for _, e := range ctr.Env {
			if e.Name == "GOMAXPROCS" {
				got = append(got, e.Value)
			}
		}
		if len(got) != 1 || got[0] != want {
			t.Errorf("cpu-limit %s: GOMAXPROCS %q, want [%s]", limit, got, want)
		}
		if q := ctr.Resources.Limits.Cpu(); q.Cmp(resource.MustParse(limit)) != 0 || len(ctr.Resources.Limits) != 1 {
			t.Errorf("cpu-limit %s: limits %v", limit, ctr.Resources.Limits)
		}
	}

	// None: no limit, and GOMAXPROCS is the runtime's to choose.
	c := testConfig()
	c.Service = "s"
	ctr := c.Container()
	if ctr.Resources.Limits != nil {
		t.Errorf("no cpu-limit: limits %v", ctr.Resources.Limits)
	}
	for _, e := range ctr.Env {
		if e.Name == "GOMAXPROCS" {
			t.Errorf("no cpu-limit: GOMAXPROCS %q set", e.Value)
		}
	}
}
