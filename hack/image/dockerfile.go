package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/tether-mcp/tether/internal/dockerfile"
)

// distroless is the base of the Dockerfile's images. The builder cannot
// pull it (no registry here), so it makes the files of it that tether
// uses (baseLayer) and refuses a Dockerfile built on anything else.
const distroless = "gcr.io/distroless/static-debian12:nonroot"

// Spec is what the Dockerfile says of one image: its build command, where
// the binary goes, and its config. It is read from the Dockerfile so that
// `make image` and `docker build` cannot drift apart.
type Spec struct {
	Target     string            // the stage (-target); "" is the last, the default image
	BuildStage string            // the stage that builds the binary
	Build      string            // its RUN line that runs go build, variables not expanded
	BinaryFrom string            // the path the build writes (COPY --from=STAGE SRC)
	BinaryTo   string            // the path of the binary in the image (COPY's DEST)
	User       string            // USER
	Entrypoint []string          // ENTRYPOINT (exec form)
	Ports      []string          // EXPOSE, as "PORT/PROTO"
	Labels     map[string]string // LABEL, variables not expanded
}

// ReadSpec reads the image of target ("" for the last stage) from the
// Dockerfile at path.
func ReadSpec(path, target string) (Spec, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return Spec{}, err
	}
	df, err := dockerfile.Parse(string(src))
	if err != nil {
		return Spec{}, fmt.Errorf("%s: %w", path, err)
	}
	final := &df.Stages[len(df.Stages)-1]
	if target != "" {
		final = df.Stage(target)
		if final == nil {
			return Spec{}, fmt.Errorf("%s: no stage %q", path, target)
		}
	}
	what := fmt.Sprintf("%s, stage %q", path, final.Name)
	if final.From != distroless {
		return Spec{}, fmt.Errorf("%s: FROM %s; this builder makes %s only", what, final.From, distroless)
	}
	spec := Spec{Target: target, Labels: map[string]string{}}
	var copies [][]string // COPY --from=STAGE SRC DEST
	var unknown []string  // instructions the builder does not make
	for _, in := range final.Instructions {
		switch in.Cmd {
		case "ARG":
		case "COPY":
			from, ok := in.Flag("from")
			if !ok {
				unknown = append(unknown, "COPY from the build context")
				continue
			}
			copies = append(copies, append([]string{from}, strings.Fields(in.Args)...))
		case "USER":
			spec.User = in.Args
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(in.Args), &spec.Entrypoint); err != nil || len(spec.Entrypoint) == 0 {
				return Spec{}, fmt.Errorf("%s: ENTRYPOINT %s: want the exec form (the image has no shell)", what, in.Args)
			}
		case "EXPOSE":
			for _, p := range strings.Fields(in.Args) {
				if !strings.Contains(p, "/") {
					p += "/tcp"
				}
				spec.Ports = append(spec.Ports, p)
			}
		case "LABEL":
			words, err := dockerfile.ShellWords(in.Args)
			if err != nil {
				return Spec{}, fmt.Errorf("%s: LABEL: %w", what, err)
			}
			for _, w := range words {
				if k, v, ok := strings.Cut(w, "="); ok {
					spec.Labels[k] = v
				}
			}
		default:
			unknown = append(unknown, in.Cmd)
		}
	}
	if len(unknown) > 0 {
		return Spec{}, fmt.Errorf("%s: %s: hack/image does not make these (only ARG, COPY --from, LABEL, USER, EXPOSE, ENTRYPOINT)", what, strings.Join(unknown, ", "))
	}
	if len(copies) != 1 || len(copies[0]) != 3 {
		return Spec{}, fmt.Errorf("%s: want one COPY --from=STAGE SRC DEST, got %q", what, copies)
	}
	if spec.Entrypoint == nil {
		return Spec{}, fmt.Errorf("%s: no ENTRYPOINT: want the exec form (the image has no shell)", what)
	}
	build := df.Stage(copies[0][0])
	if build == nil || build.Build() == "" {
		return Spec{}, fmt.Errorf("%s: copies from stage %q, which runs no go build", what, copies[0][0])
	}
	spec.BuildStage, spec.Build = build.Name, build.Build()
	spec.BinaryFrom, spec.BinaryTo = copies[0][1], copies[0][2]
	return spec, nil
}
