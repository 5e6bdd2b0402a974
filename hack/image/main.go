// Command image builds tether's two container images without a container
// engine, as the Dockerfile would: the sidecar's (the default target) and
// the webhook's. Each is written as an OCI image layout (OUT/tether/,
// OUT/tether-webhook/) and as a tarball that `docker load` reads
// (OUT/tether.tar, OUT/tether-webhook.tar).
//
// The build commands, the binary's path, the user, the entrypoint, the
// ports and the labels are read from the Dockerfile, so the two builds
// cannot drift apart. The base is made here (no registry can be reached to
// pull distroless): the files of distroless static's nonroot image that
// tether uses. Every timestamp is SOURCE_DATE_EPOCH, else the commit's
// time: the same source gives the same image digests.
//
//	cd hack/image && go run . -out ../../bin/images
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// images are the Dockerfile's two images: the directory each is written
// to and its stage.
var images = []struct{ dir, target string }{
	{"tether", ""},
	{"tether-webhook", "webhook"},
}

func main() {
	root := flag.String("root", "../..", "the repository: its Dockerfile and ./cmd/tether")
	out := flag.String("out", "", "where the images go (default ROOT/bin/images)")
	image := flag.String("image", "ghcr.io/tether-mcp/tether:dev", "the sidecar image's name, in its tarball and layout")
	webhookImage := flag.String("webhook-image", "ghcr.io/tether-mcp/tether-webhook:dev", "the webhook image's name")
	platform := flag.String("platform", "linux/amd64", "OS/ARCH of the images (linux/amd64, linux/arm64, ...)")
	version := flag.String("version", "", "the version stamped in the binary and the labels (default `git describe --tags --always --dirty`)")
	caCerts := flag.String("ca-certs", "/etc/ssl/certs/ca-certificates.crt", "the CA bundle the images carry")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if *out == "" {
		*out = filepath.Join(*root, "bin", "images")
	}
	names := map[string]string{"tether": *image, "tether-webhook": *webhookImage}
	b, err := NewBuild(*root, *platform, *version, *caCerts)
	if err == nil {
		err = run(ctx, b, *out, names)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

// run builds the images of the Dockerfile in b.Root into out, each named
// as names has it (by directory).
func run(ctx context.Context, b Build, out string, names map[string]string) error {
	for _, im := range images {
		ref, err := name.NewTag(names[im.dir])
		if err != nil {
			return err
		}
		spec, err := ReadSpec(filepath.Join(b.Root, "Dockerfile"), im.target)
		if err != nil {
			return err
		}
		img, err := b.Image(ctx, spec)
		if err != nil {
			return err
		}
		dir := filepath.Join(out, im.dir)
		if err := Write(dir, ref, img, b.Platform); err != nil {
			return err
		}
		digest, err := img.Digest()
		if err != nil {
			return err
		}
		fmt.Printf("%s %s %s (%s, and %s.tar)\n", ref, b.Version, digest, dir, dir)
	}
	return nil
}

// NewBuild is the build of the repository at root for platform (OS/ARCH),
// the version, revision and time taken from its git history where not
// given (version "", SOURCE_DATE_EPOCH unset).
func NewBuild(root, platform, version, caCerts string) (Build, error) {
	osName, arch, ok := strings.Cut(platform, "/")
	if !ok || osName != "linux" || arch == "" || strings.Contains(arch, "/") {
		return Build{}, fmt.Errorf("-platform %q: want linux/ARCH", platform)
	}
	b := Build{
		Root:     root,
		Version:  version,
		Revision: git(root, "unknown", "rev-parse", "HEAD"),
		Platform: v1.Platform{OS: osName, Architecture: arch},
		CACerts:  caCerts,
	}
	if b.Version == "" {
		b.Version = git(root, "dev", "describe", "--tags", "--always", "--dirty")
	}
	epoch := os.Getenv("SOURCE_DATE_EPOCH")
	if epoch == "" {
		epoch = git(root, "0", "log", "-1", "--format=%ct")
	}
	sec, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil {
		return Build{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", epoch, err)
	}
	b.Created = time.Unix(sec, 0).UTC()
	return b, nil
}

// git is the output of git ARGS in dir, or otherwise when it fails (a
// source tree without its history).
func git(dir, otherwise string, args ...string) string {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	b, err := cmd.Output()
	if s := strings.TrimSpace(string(b)); err == nil && s != "" {
		return s
	}
	return otherwise
}
