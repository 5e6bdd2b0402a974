package main

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/tether-mcp/tether/internal/dockerfile"
)

// Build is what varies between builds of the same Dockerfile.
type Build struct {
	Root     string      // the repository: its Dockerfile and ./cmd/tether
	Version  string      // the Dockerfile's VERSION (main.version, the version label)
	Revision string      // the Dockerfile's REVISION (the revision label): the commit
	Created  time.Time   // every timestamp in the image, for builds that repeat byte for byte
	Platform v1.Platform // OS and Architecture of the binary and the image
	CACerts  string      // the CA bundle copied to /etc/ssl/certs/ca-certificates.crt
}

// Image builds the image that spec describes: the binary, with the
// Dockerfile's go build command, on a base made here.
func (b Build) Image(ctx context.Context, spec Spec) (v1.Image, error) {
	work, err := os.MkdirTemp("", "tether-image-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	bin := filepath.Join(work, "tether")
	if err := b.goBuild(ctx, spec, bin); err != nil {
		return nil, err
	}
	base, err := baseLayer(b.CACerts, b.Created)
	if err != nil {
		return nil, err
	}
	binary, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	top, err := layer(b.Created, file(spec.BinaryTo, 0o755, binary))
	if err != nil {
		return nil, err
	}

	created := v1.Time{Time: b.Created}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.Append(img,
		mutate.Addendum{Layer: base, History: v1.History{Created: created, CreatedBy: "hack/image: the files of " + distroless + " that tether uses"}},
		mutate.Addendum{Layer: top, History: v1.History{Created: created, CreatedBy: fmt.Sprintf("COPY --from=%s %s %s", spec.BuildStage, spec.BinaryFrom, spec.BinaryTo)}},
	)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Created = created
	cf.OS, cf.Architecture = b.Platform.OS, b.Platform.Architecture
	cf.Config = v1.Config{
		User:         spec.User,
		Entrypoint:   spec.Entrypoint,
		ExposedPorts: map[string]struct{}{},
		Labels:       map[string]string{},
	}
	for _, p := range spec.Ports {
		cf.Config.ExposedPorts[p] = struct{}{}
	}
	args := b.buildArgs()
	for k, v := range spec.Labels {
		cf.Config.Labels[k] = dockerfile.Expand(v, args)
	}
	return mutate.ConfigFile(img, cf)
}

// buildArgs are the Dockerfile's build arguments, as `make docker-image`
// and docker build set them.
func (b Build) buildArgs() map[string]string {
	return map[string]string{
		"VERSION":    b.Version,
		"REVISION":   b.Revision,
		"TARGETOS":   b.Platform.OS,
		"TARGETARCH": b.Platform.Architecture,
	}
}

// goBuild runs the Dockerfile's go build command in b.Root, writing the
// binary to out instead of spec.BinaryFrom.
func (b Build) goBuild(ctx context.Context, spec Spec, out string) error {
	env, args, err := dockerfile.SplitGoBuild(spec.Build, b.buildArgs())
	if err != nil {
		return err
	}
	i := slices.Index(args, "-o")
	if i < 0 || i+1 == len(args) || args[i+1] != spec.BinaryFrom {
		return fmt.Errorf("the Dockerfile's build %q does not write %s, the file its image copies", spec.Build, spec.BinaryFrom)
	}
	args[i+1] = out
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = b.Root
	cmd.Env = append(os.Environ(), env...)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s go %s: %w\n%s", strings.Join(env, " "), strings.Join(args, " "), err, msg)
	}
	return nil
}

// baseLayer is what tether needs of distroless static's nonroot image:
// its users (tether runs as nonroot, 65532, as the injected sidecar does),
// the CA certificates (Redis over TLS, OTLP), a world-writable /tmp, and
// nothing else: no shell, no package manager.
func baseLayer(caCerts string, created time.Time) (v1.Layer, error) {
	ca, err := os.ReadFile(caCerts)
	if err != nil {
		return nil, fmt.Errorf("the CA bundle: %w", err)
	}
	// As distroless has them.
	passwd := "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group := "root:x:0:\nnobody:x:65534:\ntty:x:5:\nstaff:x:50:\nnonroot:x:65532:\n"
	home := dir("/home/nonroot", 0o700)
	home.Uid, home.Gid = 65532, 65532
	return layer(created,
		file("/etc/passwd", 0o644, []byte(passwd)),
		file("/etc/group", 0o644, []byte(group)),
		file("/etc/nsswitch.conf", 0o644, []byte("hosts: files dns\n")),
		file("/etc/ssl/certs/ca-certificates.crt", 0o644, ca),
		dir("/tmp", 0o1777),
		home,
	)
}

// entry is one file or directory of a layer.
type entry struct {
	tar.Header
	body []byte
}

func file(p string, mode int64, body []byte) entry {
	return entry{tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(p, "/"), Mode: mode, Size: int64(len(body))}, body}
}

func dir(p string, mode int64) entry {
	return entry{Header: tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(p, "/") + "/", Mode: mode}}
}

// layer makes a layer of entries, their missing parent directories added
// (0755), sorted, owned by root unless set, every time created: the same
// files give the same digest.
func layer(created time.Time, entries ...entry) (v1.Layer, error) {
	byName := map[string]entry{}
	for _, e := range entries {
		byName[e.Name] = e
		for d := path.Dir(strings.TrimSuffix(e.Name, "/")); d != "."; d = path.Dir(d) {
			if _, ok := byName[d+"/"]; !ok {
				byName[d+"/"] = dir(d, 0o755)
			}
		}
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	slices.Sort(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range names {
		e := byName[n]
		e.ModTime = created.UTC().Truncate(time.Second)
		if err := tw.WriteHeader(&e.Header); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
}

// Write writes img as an OCI image layout at dir (replacing what was
// there: one image, tagged ref) and as a tarball that `docker load` reads
// at dir.tar.
func Write(dir string, ref name.Tag, img v1.Image, platform v1.Platform) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	err = p.AppendImage(img,
		layout.WithPlatform(platform),
		layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref.TagStr()}))
	if err != nil {
		return err
	}
	return tarball.WriteToFile(dir+".tar", ref, img)
}
