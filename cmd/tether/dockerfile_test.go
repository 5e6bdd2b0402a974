package main

import (
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/tether-mcp/tether/internal/dockerfile"
)

// The images cannot be built here (no container engine), so this test
// builds what the Dockerfile's build stages build, with the flags read from
// the Dockerfile itself, and checks that each binary is static (distroless
// static has no C library) and runs. The default (last) image is the
// sidecar's: its binary is the tether_sidecar build, without the inject,
// webhook and demo commands. The webhook image (--target webhook) has the
// full binary. It also checks the final stages: the distroless static base,
// a non-root user and an exec-form entrypoint (the image has no shell).
func TestDockerfileBuildsAStaticBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds tether (-short)")
	}
	src, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df, err := dockerfile.Parse(string(src))
	if err != nil {
		t.Fatal(err)
	}

	// Go version of the build stage = go.mod's.
	gomod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	if m == nil {
		t.Fatal("no go directive in go.mod")
	}
	if len(df.Stages) < 2 {
		t.Fatalf("want a multi-stage Dockerfile, got stages %+v", df.Stages)
	}
	if build := dockerfile.Expand(df.Stages[0].From, df.Args); !strings.Contains(build, "golang:"+string(m[1])) {
		t.Errorf("build stage %q: want golang:%s (go.mod)", build, m[1])
	}
	images := []struct {
		name    string
		stage   *dockerfile.Stage
		sidecar bool
	}{
		{"sidecar", &df.Stages[len(df.Stages)-1], true},
		{"webhook", df.Stage("webhook"), false},
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	// Build in a copy of the build context (.dockerignore applied), so a
	// file the build needs cannot be left out of the image's context.
	context := buildContext(t, "../..")
	for _, img := range images {
		t.Run(img.name, func(t *testing.T) {
			final := img.stage
			if final == nil {
				t.Fatal("no such stage")
			}
			if final.From != "gcr.io/distroless/static-debian12:nonroot" {
				t.Errorf("final stage FROM %q, want gcr.io/distroless/static-debian12:nonroot", final.From)
			}
			// The last USER, ENTRYPOINT and COPY --from are the ones that count.
			var user, entrypoint, copyFrom string
			for _, in := range final.Instructions {
				switch in.Cmd {
				case "USER":
					user = in.Args
				case "ENTRYPOINT":
					entrypoint = in.Args
				case "COPY":
					if from, ok := in.Flag("from"); ok {
						copyFrom = from
					}
				}
			}
			if user == "" || user == "0" || strings.HasPrefix(user, "root") || strings.HasPrefix(user, "0:") {
				t.Errorf("USER %q: want a non-root user", user)
			}
			if !strings.HasPrefix(entrypoint, "[") {
				t.Errorf("ENTRYPOINT %s: want the exec form (the image has no shell)", entrypoint)
			}
			build := df.Stage(copyFrom)
			if build == nil || build.Build() == "" {
				t.Fatalf("the image copies from stage %q, which runs no go build", copyFrom)
			}

			// The build command, as the Dockerfile runs it.
			const testVersion = "v0.0.0-dockerfile-test"
			vars := map[string]string{"VERSION": testVersion, "TARGETOS": runtime.GOOS, "TARGETARCH": runtime.GOARCH}
			env, args, err := dockerfile.SplitGoBuild(build.Build(), vars)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(env, "CGO_ENABLED=0") {
				t.Errorf("build environment %q, want CGO_ENABLED=0", env)
			}
			if !slices.Contains(args, "-trimpath") {
				t.Errorf("build args %q: want -trimpath", args)
			}
			if i := slices.Index(args, "-ldflags"); i < 0 || !strings.Contains(args[i+1], "-X main.version="+testVersion) {
				t.Errorf("build args %q: want -ldflags with -X main.version=${VERSION}", args)
			}
			if i := slices.Index(args, "-tags"); (i >= 0 && args[i+1] == "tether_sidecar") != img.sidecar {
				t.Errorf("build args %q: want -tags tether_sidecar in the sidecar's build only", args)
			}
			out := filepath.Join(t.TempDir(), "tether")
			i := slices.Index(args, "-o")
			if i < 0 {
				t.Fatalf("build args %q: no -o", args)
			}
			args[i+1] = out

			cmd := exec.Command(goCmd, args...)
			cmd.Dir = context
			cmd.Env = append(os.Environ(), env...)
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, b)
			}

			f, err := elf.Open(out)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for _, p := range f.Progs {
				if p.Type == elf.PT_INTERP {
					t.Error("the binary has a program interpreter (PT_INTERP): it is dynamically linked")
				}
			}
			if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
				t.Errorf("the binary needs shared libraries (DT_NEEDED) %q (err %v)", libs, err)
			}

			got, err := exec.Command(out, "version").CombinedOutput()
			if first, _, _ := strings.Cut(string(got), "\n"); err != nil || first != "tether "+testVersion {
				t.Errorf("tether version: %q (err %v), want %q", got, err, "tether "+testVersion)
			}

			// The function table names every package with code in the
			// binary (-s -w strip the symbol table, not it).
			bin, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			linked := func(pkg string) bool { return bytes.Contains(bin, []byte(pkg+".")) }
			if !linked("github.com/tether-mcp/tether/internal/proxy") {
				t.Error("the binary has no function of internal/proxy: the check below cannot see packages")
			}
			// inject, webhook and demo are the full build's; no build has
			// client-go's clientset or its scheme of every API group
			// (discovery has a client of its own).
			for _, pkg := range []string{"github.com/tether-mcp/tether/internal/inject", "k8s.io/api/admission/v1", "github.com/modelcontextprotocol/go-sdk/mcp"} {
				if linked(pkg) == img.sidecar {
					t.Errorf("%s linked: %v, want %v", pkg, linked(pkg), !img.sidecar)
				}
			}
			for _, pkg := range []string{"k8s.io/client-go/kubernetes", "k8s.io/client-go/kubernetes/scheme", "k8s.io/api/apps/v1"} {
				if linked(pkg) {
					t.Errorf("%s linked, want it in no build", pkg)
				}
			}
			webhook, err := exec.Command(out, "webhook", "-h").CombinedOutput()
			if img.sidecar && (err == nil || !strings.Contains(string(webhook), "not in this build")) {
				t.Errorf("tether webhook -h in the sidecar image: %q (err %v), want it to say the command is not in this build", webhook, err)
			}
			if !img.sidecar && (err != nil || !strings.Contains(string(webhook), "usage: tether webhook")) {
				t.Errorf("tether webhook -h in the webhook image: %q (err %v), want its usage", webhook, err)
			}
		})
	}
}

// buildContext copies root into a temporary directory, leaving out what
// root/.dockerignore excludes, as docker does before a build.
func buildContext(t *testing.T, root string) string {
	t.Helper()
	ignore, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for _, l := range strings.Split(string(ignore), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			if strings.HasPrefix(l, "!") {
				t.Fatalf(".dockerignore: exceptions (%s) are not supported by this test", l)
			}
			patterns = append(patterns, strings.TrimPrefix(filepath.Clean(l), "/"))
		}
	}
	excluded := func(rel string) bool {
		for _, p := range patterns {
			if ok, _ := filepath.Match(p, rel); ok {
				return true
			}
			// **/NAME: NAME at any depth.
			if name, ok := strings.CutPrefix(p, "**/"); ok {
				if m, _ := filepath.Match(name, filepath.Base(rel)); m {
					return true
				}
			}
		}
		return false
	}
	dst := t.TempDir()
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil || rel == "." {
			return err
		}
		if excluded(rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}
