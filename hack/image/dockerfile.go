package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
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

// stage is one FROM and the instructions of it the builder reads.
type stage struct {
	name       string
	from       string
	copies     [][]string // COPY --from=STAGE SRC DEST
	user       string
	entrypoint string
	ports      []string
	labels     map[string]string
	build      string
	unknown    []string // instructions the builder does not read
}

// ReadSpec reads the image of target ("" for the last stage) from the
// Dockerfile at path.
func ReadSpec(path, target string) (Spec, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return Spec{}, err
	}
	stages := parseDockerfile(string(src))
	if len(stages) == 0 {
		return Spec{}, fmt.Errorf("%s: no FROM", path)
	}
	final := &stages[len(stages)-1]
	if target != "" {
		final = findStage(stages, target)
		if final == nil {
			return Spec{}, fmt.Errorf("%s: no stage %q", path, target)
		}
	}
	what := fmt.Sprintf("%s, stage %q", path, final.name)
	if final.from != distroless {
		return Spec{}, fmt.Errorf("%s: FROM %s; this builder makes %s only", what, final.from, distroless)
	}
	if len(final.unknown) > 0 {
		return Spec{}, fmt.Errorf("%s: %s: hack/image does not make these (only ARG, COPY --from, LABEL, USER, EXPOSE, ENTRYPOINT)", what, strings.Join(final.unknown, ", "))
	}
	if len(final.copies) != 1 || len(final.copies[0]) != 3 {
		return Spec{}, fmt.Errorf("%s: want one COPY --from=STAGE SRC DEST, got %q", what, final.copies)
	}
	copied := final.copies[0]
	build := findStage(stages, copied[0])
	if build == nil || build.build == "" {
		return Spec{}, fmt.Errorf("%s: copies from stage %q, which runs no go build", what, copied[0])
	}
	spec := Spec{
		Target:     target,
		BuildStage: build.name,
		Build:      build.build,
		BinaryFrom: copied[1],
		BinaryTo:   copied[2],
		User:       final.user,
		Ports:      final.ports,
		Labels:     final.labels,
	}
	if err := json.Unmarshal([]byte(final.entrypoint), &spec.Entrypoint); err != nil || len(spec.Entrypoint) == 0 {
		return Spec{}, fmt.Errorf("%s: ENTRYPOINT %s: want the exec form (the image has no shell)", what, final.entrypoint)
	}
	return spec, nil
}

func findStage(stages []stage, name string) *stage {
	for i := range stages {
		if stages[i].name == name {
			return &stages[i]
		}
	}
	return nil
}

// parseDockerfile reads the instructions of src that the images depend on,
// as cmd/tether/dockerfile_test.go reads them.
func parseDockerfile(src string) []stage {
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
	dropFlags := func(fields []string) []string {
		for len(fields) > 0 && strings.HasPrefix(fields[0], "--") {
			fields = fields[1:]
		}
		return fields
	}
	var stages []stage
	st := &stage{} // before the first FROM: ARG only
	for _, l := range lines {
		instr, rest, _ := strings.Cut(l, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(instr) {
		case "FROM":
			fields := dropFlags(strings.Fields(rest))
			stages = append(stages, stage{labels: map[string]string{}})
			st = &stages[len(stages)-1]
			if len(fields) > 0 {
				st.from = fields[0]
			}
			if len(fields) == 3 && strings.EqualFold(fields[1], "AS") {
				st.name = fields[2]
			}
		case "COPY":
			fields := strings.Fields(rest)
			if i := slices.IndexFunc(fields, func(f string) bool { return strings.HasPrefix(f, "--from=") }); i >= 0 {
				st.copies = append(st.copies, append([]string{strings.TrimPrefix(fields[i], "--from=")}, dropFlags(fields[i:])...))
			} else {
				st.unknown = append(st.unknown, "COPY from the build context")
			}
		case "USER":
			st.user = rest
		case "ENTRYPOINT":
			st.entrypoint = rest
		case "EXPOSE":
			for _, p := range strings.Fields(rest) {
				if !strings.Contains(p, "/") {
					p += "/tcp"
				}
				st.ports = append(st.ports, p)
			}
		case "LABEL":
			for _, w := range shellWords(rest) {
				if k, v, ok := strings.Cut(w, "="); ok {
					st.labels[k] = v
				}
			}
		case "RUN":
			if cmd := strings.Join(dropFlags(strings.Fields(rest)), " "); strings.Contains(cmd, "go build") {
				st.build = cmd
			}
			st.unknown = append(st.unknown, instr)
		case "ARG":
		default:
			st.unknown = append(st.unknown, instr)
		}
	}
	return stages
}

// shellWords splits s into words as a POSIX shell does, double and single
// quotes included (no escapes, no expansion).
func shellWords(s string) []string {
	var words []string
	var b strings.Builder
	inWord := false
	var quote rune
	for _, r := range s {
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
	return words
}

// goBuild splits the Dockerfile's build command, its variables expanded
// from vars, into its environment and go's arguments:
// `A=1 B=2 go build ARGS...`.
func goBuild(cmd string, vars map[string]string) (env []string, args []string, err error) {
	words := shellWords(os.Expand(cmd, func(k string) string { return vars[k] }))
	for len(words) > 0 {
		k, _, ok := strings.Cut(words[0], "=")
		if !ok || strings.ContainsAny(k, "-/") {
			break
		}
		env = append(env, words[0])
		words = words[1:]
	}
	if len(words) < 2 || words[0] != "go" || words[1] != "build" {
		return nil, nil, fmt.Errorf("the Dockerfile's build command %q is not `[VAR=VALUE]... go build ...`", cmd)
	}
	return env, words[1:], nil
}
