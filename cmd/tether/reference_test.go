package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// docs/reference.md is the reference: every flag of `tether serve`, every
// metric tether registers, every annotation the injection reads, every
// environment variable the commands read and every admin endpoint is in
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

	// The environment the commands read besides the flags' TETHER_*
	// (through the getenv they are given), and the admin routes.
	var env []string
	for _, dir := range []string{".", "../../internal/server", "../../internal/telemetry", "../../internal/discovery", "../../internal/podcost"} {
		env = append(env, namesInSources(t, dir, `getenv\("([A-Z][A-Z0-9_]+)"\)`)...)
	}
	if len(env) < 8 {
		t.Fatalf("found %d environment variables read: the way they are read changed?", len(env))
	}
	for _, v := range env {
		if !strings.Contains(ref, "`"+v+"`") {
			t.Errorf("environment variable %s is not in docs/reference.md", v)
		}
	}
	routes := namesInSources(t, "../../internal/server", `mux\.Handle(?:Func)?\("(?:[A-Z]+ )?(/[^"]*)"`)
	if len(routes) < 6 {
		t.Fatalf("found %d admin routes in internal/server: their registration changed?", len(routes))
	}
	for _, r := range routes {
		if !strings.Contains(ref, r+"`") && !strings.Contains(ref, r+"?") {
			t.Errorf("admin endpoint %s is not in docs/reference.md", r)
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

// The README is a front page: short, and every fact it leaves out is one
// link away. Every relative link of the README and of docs/ must name a
// file that exists and, with a #fragment, a heading of that file (GitHub's
// anchors).
func TestDocsLinksResolve(t *testing.T) {
	const root = "../.."
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(readme), "\n"); n > 300 {
		t.Errorf("README.md has %d lines, want at most 300: move the detail to docs/", n)
	}
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join(root, "README.md"), filepath.Join(root, "bench", "README.md"), filepath.Join(root, "deploy", "helm", "tether", "README.md"))
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	anchors := map[string]map[string]bool{}
	checked := 0
	for _, page := range pages {
		src, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(stripCode(string(src)), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s: link %s: %v", page, target, err)
				continue
			}
			checked++
			if frag == "" || !strings.HasSuffix(path, ".md") {
				continue
			}
			if anchors[path] == nil {
				anchors[path] = headingAnchors(t, path)
			}
			if !anchors[path][frag] {
				t.Errorf("%s: link %s: no heading with that anchor in %s", page, target, path)
			}
		}
	}
	if checked < 50 {
		t.Fatalf("checked %d links: the pages moved?", checked)
	}
}

// stripCode removes fenced code blocks, whose lines are neither headings
// nor links.
func stripCode(md string) string {
	var out strings.Builder
	inFence := false
	for line := range strings.Lines(md) {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			continue
		}
		if !inFence {
			out.WriteString(line)
		}
	}
	return out.String()
}

// headingAnchors returns the anchors GitHub gives the headings of a
// Markdown file: lower case, spaces to hyphens, punctuation other than
// hyphens and underscores dropped, repeats numbered.
func headingAnchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	seen := map[string]int{}
	for line := range strings.Lines(stripCode(string(src))) {
		text, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), "#")
		if !ok {
			continue
		}
		text = strings.TrimSpace(strings.TrimLeft(text, "#"))
		var slug strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case r == ' ':
				slug.WriteByte('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				slug.WriteRune(r)
			}
		}
		s := slug.String()
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}
