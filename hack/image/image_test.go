package main

import (
	"archive/tar"
	"context"
	"crypto/x509"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/tether-mcp/tether/internal/dockerfile"
)

const caCerts = "/etc/ssl/certs/ca-certificates.crt"

// TestImages builds both images as `make image` does, reads each back
// from its OCI layout and its tarball, checks its config and every file in
// it, and runs its binary. A second build must give the same digests.
func TestImages(t *testing.T) {
	if testing.Short() {
		t.Skip("builds tether twice (-short)")
	}
	// A copy of what the build reads, so that edits made to the tree while
	// the test runs cannot make the two builds differ.
	root := snapshot(t, "../..", "go.mod", "go.sum", "Dockerfile", "cmd", "internal")
	const version = "v0.0.0-image-test"
	b := Build{
		Root:     root,
		Version:  version,
		Revision: "0123456789abcdef0123456789abcdef01234567",
		Created:  time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Platform: v1.Platform{OS: "linux", Architecture: runtime.GOARCH},
		CACerts:  caCerts,
	}
	platform := "linux/" + runtime.GOARCH
	names := map[string]string{
		"tether":         "registry.test/tether:test",
		"tether-webhook": "registry.test/tether-webhook:test",
	}
	out := t.TempDir()
	if err := run(context.Background(), b, out, names); err != nil {
		t.Fatal(err)
	}

	// The source label is the module's repository.
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	module := regexp.MustCompile(`(?m)^module (\S+)`).FindSubmatch(gomod)
	if module == nil {
		t.Fatal("no module in go.mod")
	}
	wantLabels := func(title string) map[string]string {
		return map[string]string{
			"org.opencontainers.image.title":    title,
			"org.opencontainers.image.source":   "https://" + string(module[1]),
			"org.opencontainers.image.version":  version,
			"org.opencontainers.image.revision": b.Revision,
		}
	}
	goVersion, err := exec.Command("go", "env", "GOVERSION").Output()
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		dir     string
		ports   []string
		sidecar bool
	}{
		{"tether", []string{"7480/tcp", "7481/tcp"}, true},
		{"tether-webhook", []string{"8443/tcp"}, false},
	}
	digests := map[string]v1.Hash{}
	for _, tt := range tests {
		t.Run(tt.dir, func(t *testing.T) {
			dir := filepath.Join(out, tt.dir)
			img := readLayout(t, dir, platform, "test")
			digest, err := img.Digest()
			if err != nil {
				t.Fatal(err)
			}
			digests[tt.dir] = digest

			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if cf.OS+"/"+cf.Architecture != platform {
				t.Errorf("platform %s/%s, want %s", cf.OS, cf.Architecture, platform)
			}
			if !cf.Created.Equal(b.Created) {
				t.Errorf("created %v, want %v", cf.Created, b.Created)
			}
			c := cf.Config
			if c.User != "65532:65532" {
				t.Errorf("User %q, want 65532:65532 (distroless' nonroot)", c.User)
			}
			if !slices.Equal(c.Entrypoint, []string{"/tether"}) || c.Cmd != nil {
				t.Errorf("Entrypoint %q Cmd %q, want [/tether] and no Cmd", c.Entrypoint, c.Cmd)
			}
			if ports := slices.Sorted(maps.Keys(c.ExposedPorts)); !slices.Equal(ports, tt.ports) {
				t.Errorf("ExposedPorts %q, want %q", ports, tt.ports)
			}
			if want := wantLabels(tt.dir); !maps.Equal(c.Labels, want) {
				t.Errorf("Labels %q, want %q", c.Labels, want)
			}
			if len(c.Env) != 0 {
				t.Errorf("Env %q, want none", c.Env)
			}

			// The tarball is the same image, under its name.
			tag, err := name.NewTag(names[tt.dir])
			if err != nil {
				t.Fatal(err)
			}
			fromTar, err := tarball.ImageFromPath(dir+".tar", &tag)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := configName(t, fromTar), configName(t, img); got != want {
				t.Errorf("%s.tar has config %s, the layout %s", dir, got, want)
			}

			files := flatten(t, img)
			// Every path of the image: no shell, no /bin, nothing else.
			want := []string{
				"etc", "etc/group", "etc/nsswitch.conf", "etc/passwd",
				"etc/ssl", "etc/ssl/certs", "etc/ssl/certs/ca-certificates.crt",
				"home", "home/nonroot", "tether", "tmp",
			}
			if got := slices.Sorted(maps.Keys(files)); !slices.Equal(got, want) {
				t.Errorf("files %q, want %q", got, want)
			}
			for p, f := range files {
				owner := 0
				if p == "home/nonroot" {
					owner = 65532
				}
				if f.Uid != owner || f.Gid != owner || !f.ModTime.Equal(b.Created) {
					t.Errorf("%s: owner %d:%d, time %v; want %d:%d, %v", p, f.Uid, f.Gid, f.ModTime, owner, owner, b.Created)
				}
			}
			if f := files["tmp"]; f.Typeflag != tar.TypeDir || f.Mode != 0o1777 {
				t.Errorf("/tmp: type %c mode %o, want a directory, 1777", f.Typeflag, f.Mode)
			}
			if f := files["tether"]; f.Typeflag != tar.TypeReg || f.Mode != 0o755 {
				t.Errorf("/tether: type %c mode %o, want a file, 0755", f.Typeflag, f.Mode)
			}
			if passwd := string(files["etc/passwd"].body); !strings.Contains(passwd, "\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n") {
				t.Errorf("/etc/passwd has no nonroot (65532):\n%s", passwd)
			}
			if group := string(files["etc/group"].body); !strings.Contains(group, "\nnonroot:x:65532:\n") {
				t.Errorf("/etc/group has no nonroot (65532):\n%s", group)
			}
			ca, err := os.ReadFile(caCerts)
			if err != nil {
				t.Fatal(err)
			}
			if bundle := files["etc/ssl/certs/ca-certificates.crt"].body; string(bundle) != string(ca) || !x509.NewCertPool().AppendCertsFromPEM(bundle) {
				t.Errorf("the image's CA bundle (%d bytes) is not %s (%d bytes) or has no certificate", len(bundle), caCerts, len(ca))
			}

			// The binary runs, and is the build of this image.
			bin := filepath.Join(t.TempDir(), "tether")
			if err := os.WriteFile(bin, files["tether"].body, 0o755); err != nil {
				t.Fatal(err)
			}
			got, err := exec.Command(bin, "version").CombinedOutput()
			if err != nil {
				t.Fatalf("tether version: %v\n%s", err, got)
			}
			build := "full"
			if tt.sidecar {
				build = "sidecar (-tags tether_sidecar)"
			}
			for _, line := range []string{
				"tether " + version + "\n",
				"  go      " + strings.TrimSpace(string(goVersion)) + " " + platform + "\n",
				"  build   " + build + "\n",
			} {
				if !strings.Contains(string(got), line) {
					t.Errorf("tether version says\n%s\nwant the line %q", got, line)
				}
			}
			webhook, err := exec.Command(bin, "webhook", "-h").CombinedOutput()
			if tt.sidecar && (err == nil || !strings.Contains(string(webhook), "not in this build")) {
				t.Errorf("tether webhook -h in the sidecar image: %q (err %v), want it to say the command is not in this build", webhook, err)
			}
			if !tt.sidecar && (err != nil || !strings.Contains(string(webhook), "usage: tether webhook")) {
				t.Errorf("tether webhook -h in the webhook image: %q (err %v), want its usage", webhook, err)
			}
		})
	}

	// Again, elsewhere: the same source gives the same images.
	again := t.TempDir()
	if err := run(context.Background(), b, again, names); err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		img := readLayout(t, filepath.Join(again, tt.dir), platform, "test")
		if d, err := img.Digest(); err != nil || d != digests[tt.dir] {
			t.Errorf("%s built twice: digests %s and %s (err %v), want the same", tt.dir, digests[tt.dir], d, err)
		}
	}
}

// readLayout reads the one image of the OCI layout at dir, checking its
// descriptor's platform and tag.
func readLayout(t *testing.T, dir, platform, tag string) v1.Image {
	t.Helper()
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Manifests) != 1 {
		t.Fatalf("%s has %d manifests, want 1", dir, len(m.Manifests))
	}
	d := m.Manifests[0]
	if d.Platform == nil || d.Platform.OS+"/"+d.Platform.Architecture != platform {
		t.Errorf("%s: platform %v, want %s", dir, d.Platform, platform)
	}
	if got := d.Annotations["org.opencontainers.image.ref.name"]; got != tag {
		t.Errorf("%s: ref.name %q, want %q", dir, got, tag)
	}
	img, err := idx.Image(d.Digest)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func configName(t *testing.T, img v1.Image) v1.Hash {
	t.Helper()
	h, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// flatten reads img's filesystem, every layer applied, by path (without
// a leading or trailing slash).
func flatten(t *testing.T, img v1.Image) map[string]entry {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	files := map[string]entry{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[strings.Trim(h.Name, "/")] = entry{*h, body}
	}
}

// snapshot copies the files and directories paths of root to a temporary
// directory.
func snapshot(t *testing.T, root string, paths ...string) string {
	t.Helper()
	dst := t.TempDir()
	for _, p := range paths {
		err := filepath.WalkDir(filepath.Join(root, p), func(path string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
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
	}
	return dst
}

func TestNewBuildPlatform(t *testing.T) {
	for _, tt := range []struct {
		platform string
		want     v1.Platform
		ok       bool
	}{
		{"linux/amd64", v1.Platform{OS: "linux", Architecture: "amd64"}, true},
		{"linux/arm64", v1.Platform{OS: "linux", Architecture: "arm64"}, true},
		{"darwin/arm64", v1.Platform{}, false},
		{"linux", v1.Platform{}, false},
		{"linux/arm/v7", v1.Platform{}, false},
	} {
		b, err := NewBuild(t.TempDir(), tt.platform, "v1", caCerts)
		if (err == nil) != tt.ok || (tt.ok && (b.Platform.OS != tt.want.OS || b.Platform.Architecture != tt.want.Architecture)) {
			t.Errorf("NewBuild(%q): platform %+v, err %v; want %+v, ok %v", tt.platform, b.Platform, err, tt.want, tt.ok)
		}
	}
}

// TestNewBuildWithoutGit: a source tree without its history builds as
// version dev, revision unknown, at SOURCE_DATE_EPOCH.
func TestNewBuildWithoutGit(t *testing.T) {
	t.Setenv("SOURCE_DATE_EPOCH", "1767323045")
	b, err := NewBuild(t.TempDir(), "linux/amd64", "", caCerts)
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Unix(1767323045, 0); b.Version != "dev" || b.Revision != "unknown" || !b.Created.Equal(want) {
		t.Errorf("version %q revision %q created %v, want dev, unknown, %v", b.Version, b.Revision, b.Created, want)
	}
}

// TestReadSpecRefusesWhatItCannotBuild: the builder makes distroless'
// files itself, so a Dockerfile on another base, or whose image does not
// copy a go build's output, is an error rather than a different image.
func TestReadSpecRefusesWhatItCannotBuild(t *testing.T) {
	const build = "FROM golang:1.26 AS build\nRUN CGO_ENABLED=0 go build -o /out/tether ./cmd/tether\n"
	for _, tt := range []struct {
		name, dockerfile, wantErr string
	}{
		{"another base", build + "FROM alpine:3\nCOPY --from=build /out/tether /tether\nENTRYPOINT [\"/tether\"]\n", "FROM alpine:3"},
		{"no go build", "FROM golang:1.26 AS build\nRUN true\nFROM " + distroless + "\nCOPY --from=build /out/tether /tether\nENTRYPOINT [\"/tether\"]\n", "runs no go build"},
		{"ENV in the image", build + "FROM " + distroless + "\nENV A=1\nCOPY --from=build /out/tether /tether\nENTRYPOINT [\"/tether\"]\n", "ENV"},
		{"shell entrypoint", build + "FROM " + distroless + "\nCOPY --from=build /out/tether /tether\nENTRYPOINT /tether\n", "exec form"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "Dockerfile")
			if err := os.WriteFile(path, []byte(tt.dockerfile), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := ReadSpec(path, ""); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ReadSpec: %v, want an error saying %q", err, tt.wantErr)
			}
		})
	}
}

// TestReadSpecOfTheDockerfile: what the builder reads of the repository's
// Dockerfile (TestImages checks what it makes of it).
func TestReadSpecOfTheDockerfile(t *testing.T) {
	for _, tt := range []struct {
		target, buildStage, tags string
	}{
		{"", "build-sidecar", "tether_sidecar"},
		{"webhook", "build-full", ""},
	} {
		spec, err := ReadSpec("../../Dockerfile", tt.target)
		if err != nil {
			t.Fatal(err)
		}
		if spec.BuildStage != tt.buildStage || spec.BinaryTo != "/tether" {
			t.Errorf("target %q: binary from stage %q to %s, want %q to /tether", tt.target, spec.BuildStage, spec.BinaryTo, tt.buildStage)
		}
		env, args, err := dockerfile.SplitGoBuild(spec.Build, map[string]string{"VERSION": "v9", "TARGETOS": "linux", "TARGETARCH": "arm64"})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range []string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=arm64"} {
			if !slices.Contains(env, e) {
				t.Errorf("target %q: build environment %q, want %s", tt.target, env, e)
			}
		}
		if i := slices.Index(args, "-tags"); (i >= 0 && args[i+1] == "tether_sidecar") != (tt.tags != "") {
			t.Errorf("target %q: build args %q, want -tags tether_sidecar in the sidecar's build only", tt.target, args)
		}
		if i := slices.Index(args, "-ldflags"); i < 0 || !strings.Contains(args[i+1], "-X main.version=v9") {
			t.Errorf("target %q: build args %q, want -ldflags with -X main.version=${VERSION}", tt.target, args)
		}
	}
}
