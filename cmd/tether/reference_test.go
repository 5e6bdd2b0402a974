package main

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// docs/reference.md is the reference: every flag of `tether serve`, every
// metric tether registers and every annotation the injection reads is in
// it. A new one without its line fails here.
func TestReferenceIsComplete(t *testing.T) {
	raw, err := os.ReadFile("../../docs/reference.md")
	if err != nil {
		t.Fatal(err)
	}
	ref := string(raw)

	var usage strings.Builder
	if _, err := parseServeFlags([]string{"-h"}, func(string) string { return "" }, &usage); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("serve -h: %v, want flag.ErrHelp", err)
	}
	flags := regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(usage.String(), -1)
	if len(flags) < 30 {
		t.Fatalf("read %d flags from serve -h: the usage format changed?\n%s", len(flags), usage.String())
	}
	for _, f := range flags {
		if !strings.Contains(ref, "`--"+f[1]) {
			t.Errorf("flag --%s is not in docs/reference.md", f[1])
		}
	}

	metrics := namesInSources(t, "../../internal/telemetry", `"(tether_[a-z_]+)"`)
	if len(metrics) < 20 {
		t.Fatalf("found %d metric names in internal/telemetry: the registration changed?", len(metrics))
	}
	for _, m := range metrics {
		if !strings.Contains(ref, "`"+m+"`") && !strings.Contains(ref, "`"+m+"{") {
			t.Errorf("metric %s is not in docs/reference.md", m)
		}
	}

	annotations := namesInSources(t, "../../internal/inject", `"(tether\.dev/[a-z-]+)"`)
	if len(annotations) < 10 {
		t.Fatalf("found %d annotations in internal/inject: their definition changed?", len(annotations))
	}
	for _, a := range annotations {
		if !strings.Contains(ref, "`"+a+"`") {
			t.Errorf("annotation %s is not in docs/reference.md", a)
		}
	}
}

// namesInSources returns the distinct first groups of pattern in the
// non-test Go files of dir.
func namesInSources(t *testing.T, dir, pattern string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(pattern)
	seen := map[string]bool{}
	var out []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(src), -1) {
			if !seen[m[1]] {
				seen[m[1]] = true
				out = append(out, m[1])
			}
		}
	}
	return out
}
