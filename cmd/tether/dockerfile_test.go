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
	df := parseDockerfile(string(src))

	// Go version of the build stage = go.mod's.
	gomod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	if m == nil {
		t.Fatal("no go directive in go.mod")
	}
	if len(df.stages) < 2 {
		t.Fatalf("want a multi-stage Dockerfile, got stages %+v", df.stages)
	}
	if build := expand(df.stages[0].from, df.args); !strings.Contains(build, "golang:"+string(m[1])) {
		t.Errorf("build stage %q: want golang:%s (go.mod)", build, m[1])
	}
	images := []struct {
		name    string
		stage   *stage
		sidecar bool
	}{
		{"sidecar", &df.stages[len(df.stages)-1], true},
		{"webhook", df.stage("webhook"), false},
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
			if final.from != "gcr.io/distroless/static-debian12:nonroot" {
				t.Errorf("final stage FROM %q, want gcr.io/distroless/static-debian12:nonroot", final.from)
			}
			if u := final.user; u == "" || u == "0" || strings.HasPrefix(u, "root") || strings.HasPrefix(u, "0:") {
				t.Errorf("USER %q: want a non-root user", u)
			}
			if !strings.HasPrefix(final.entrypoint, "[") {
				t.Errorf("ENTRYPOINT %s: want the exec form (the image has no shell)", final.entrypoint)
			}
			build := df.stage(final.copyFrom)
			if build == nil || build.build == "" {
				t.Fatalf("the image copies from stage %q, which runs no go build", final.copyFrom)
			}

			// The build command, as the Dockerfile runs it.
			const testVersion = "v0.0.0-dockerfile-test"
			vars := map[string]string{"VERSION": testVersion, "TARGETOS": runtime.GOOS, "TARGETARCH": runtime.GOARCH}
			env, args := splitBuildCommand(t, expand(build.build, vars))
			if env["CGO_ENABLED"] != "0" {
				t.Errorf("build sets CGO_ENABLED=%q, want 0", env["CGO_ENABLED"])
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
			cmd.Env = os.Environ()
			for k, v := range env {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
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

// dockerfile is what the test reads from the Dockerfile.
type dockerfile struct {
	args   map[string]string // ARG defaults
	stages []stage
}

// stage is one FROM and what the test reads of it.
type stage struct {
	name       string // AS NAME
	from       string // its image or stage (flags dropped)
	copyFrom   string // the stage of its last COPY --from
	user       string // the last USER
	entrypoint string // the last ENTRYPOINT
	build      string // the RUN command that runs go build (mount flags dropped)
}

func (df dockerfile) stage(name string) *stage {
	for i := range df.stages {
		if df.stages[i].name == name {
			return &df.stages[i]
		}
	}
	return nil
}

func parseDockerfile(src string) dockerfile {
	df := dockerfile{args: map[string]string{}}
	// Join continuation lines, drop comments.
	var lines []string
	cur := ""
	for _, l := range strings.Split(src, "\n") {
		if t := strings.TrimSpace(l); strings.HasPrefix(t, "#") || (t == "" && cur == "") {
			continue
		}
		if strings.HasSuffix(l, "\\") {
			cur += strings.TrimSuffix(l, "\\") + " "
			continue
		}
		lines = append(lines, strings.TrimSpace(cur+l))
		cur = ""
	}
	st := &stage{} // instructions before the first FROM (ARG only)
	dropFlags := func(fields []string) []string {
		for len(fields) > 0 && strings.HasPrefix(fields[0], "--") {
			fields = fields[1:]
		}
		return fields
	}
	for _, l := range lines {
		instr, rest, _ := strings.Cut(l, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(instr) {
		case "ARG":
			if k, v, ok := strings.Cut(rest, "="); ok {
				df.args[k] = v
			}
		case "FROM":
			fields := dropFlags(strings.Fields(rest))
			df.stages = append(df.stages, stage{})
			st = &df.stages[len(df.stages)-1]
			if len(fields) > 0 {
				st.from = fields[0]
			}
			if len(fields) == 3 && strings.EqualFold(fields[1], "AS") {
				st.name = fields[2]
			}
		case "COPY":
			for _, f := range strings.Fields(rest) {
				if from, ok := strings.CutPrefix(f, "--from="); ok {
					st.copyFrom = from
				}
			}
		case "USER":
			st.user = rest
		case "ENTRYPOINT":
			st.entrypoint = rest
		case "RUN":
			if cmd := strings.Join(dropFlags(strings.Fields(rest)), " "); strings.Contains(cmd, "go build") {
				st.build = cmd
			}
		}
	}
	return df
}

// expand replaces ${NAME} and $NAME from vars.
func expand(s string, vars map[string]string) string {
	return os.Expand(s, func(k string) string { return vars[k] })
}

// splitBuildCommand splits `A=1 B=2 go build ARGS...` into its environment
// and go's arguments (words as a POSIX shell splits them, double and single
// quotes included).
func splitBuildCommand(t *testing.T, cmd string) (map[string]string, []string) {
	t.Helper()
	var words []string
	var b strings.Builder
	inWord := false
	var quote rune
	for _, r := range cmd {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			b.WriteRune(r)
		case r == '"' || r == '\'':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, b.String())
				b.Reset()
				inWord = false
			}
		default:
			b.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, b.String())
	}
	env := map[string]string{}
	for len(words) > 0 {
		k, v, ok := strings.Cut(words[0], "=")
		if !ok || strings.ContainsAny(k, "-/") {
			break
		}
		env[k] = v
		words = words[1:]
	}
	if len(words) < 2 || words[0] != "go" || words[1] != "build" {
		t.Fatalf("the Dockerfile's build command %q is not `[VAR=VALUE]... go build ...`", cmd)
	}
	return env, words[1:]
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
