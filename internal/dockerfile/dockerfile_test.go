package dockerfile

import (
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tt := range []struct {
		name, src string
		want      File
		wantErr   string
	}{
		{
			name: "stages, global ARGs, comments",
			src: "# syntax=docker/dockerfile:1\n" +
				"ARG GO_VERSION=1.26\nARG TARGETOS\n\n" +
				"FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build\n" +
				"# a comment\n" +
				"WORKDIR /src\n" +
				"FROM gcr.io/distroless/static-debian12:nonroot\n" +
				"COPY --from=build /out/tether /tether\n" +
				"ENTRYPOINT [\"/tether\"]\n",
			want: File{
				Args: map[string]string{"GO_VERSION": "1.26", "TARGETOS": ""},
				Stages: []Stage{
					{Name: "build", From: "golang:${GO_VERSION}", Instructions: []Instruction{{Cmd: "WORKDIR", Args: "/src"}}},
					{From: "gcr.io/distroless/static-debian12:nonroot", Instructions: []Instruction{
						{Cmd: "COPY", Flags: []string{"--from=build"}, Args: "/out/tether /tether"},
						{Cmd: "ENTRYPOINT", Args: `["/tether"]`},
					}},
				},
			},
		},
		{
			name: "continuations, with a comment and a blank line inside, and --mount flags",
			src: "from golang:1.26 as build\n" +
				"run --mount=type=cache,target=/go/pkg/mod \\\n" +
				"\t--mount=type=cache,target=/root/.cache/go-build \\  \n" +
				"    # the build\n" +
				"\n" +
				"    CGO_ENABLED=0 \\\n" +
				"    go build -o /out/tether ./cmd/tether\n" +
				"LABEL a=\"x y\" \\\n",
			want: File{
				Args: map[string]string{},
				Stages: []Stage{{Name: "build", From: "golang:1.26", Instructions: []Instruction{
					{Cmd: "RUN", Flags: []string{"--mount=type=cache,target=/go/pkg/mod", "--mount=type=cache,target=/root/.cache/go-build"}, Args: "CGO_ENABLED=0 go build -o /out/tether ./cmd/tether"},
					{Cmd: "LABEL", Args: `a="x y"`},
				}}},
			},
		},
		{name: "no FROM", src: "ARG A=1\n# FROM x\n", wantErr: "no FROM"},
		{name: "an instruction before FROM", src: "RUN true\nFROM x\n", wantErr: "RUN before the first FROM"},
		{name: "FROM without an image", src: "FROM --platform=linux/amd64\n", wantErr: "want FROM IMAGE [AS NAME]"},
		{name: "FROM IMAGE NAME", src: "FROM golang build\n", wantErr: "want FROM IMAGE [AS NAME]"},
		{name: "an unterminated quote in an ARG", src: "ARG A=\"1\nFROM x\n", wantErr: "unterminated"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.src)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse: %+v, %v; want an error saying %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Parse:\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestStageAndFlag(t *testing.T) {
	f, err := Parse("FROM golang AS build\n" +
		"RUN go mod download\n" +
		"RUN --mount=type=cache,target=/go/pkg/mod go build -o /out/a ./a\n" +
		"RUN --network=none go build -o /out/b ./b\n" +
		"RUN echo done\n" +
		"FROM scratch AS final\n" +
		"COPY --chown=0:0 --from=build /out/b /b\n")
	if err != nil {
		t.Fatal(err)
	}
	if f.Stage("nope") != nil {
		t.Error(`Stage("nope") is not nil`)
	}
	if got, want := f.Stage("build").Build(), "go build -o /out/b ./b"; got != want {
		t.Errorf("Build() = %q, want the last RUN that runs go build, %q", got, want)
	}
	if got := f.Stage("final").Build(); got != "" {
		t.Errorf("Build() of a stage without go build = %q, want \"\"", got)
	}
	copy := f.Stage("final").Instructions[0]
	if v, ok := copy.Flag("from"); v != "build" || !ok {
		t.Errorf("Flag(from) = %q, %v; want build, true", v, ok)
	}
	if v, ok := copy.Flag("link"); v != "" || ok {
		t.Errorf("Flag(link) = %q, %v; want \"\", false", v, ok)
	}
}

func TestShellWords(t *testing.T) {
	for _, tt := range []struct {
		in      string
		want    []string
		wantErr string
	}{
		{"", nil, ""},
		{" \t a  b\tc ", []string{"a", "b", "c"}, ""},
		{`-ldflags "-s -w -X main.version=v1" -o out`, []string{"-ldflags", "-s -w -X main.version=v1", "-o", "out"}, ""},
		{`a='x "y" z' b="x 'y'"`, []string{`a=x "y" z`, `b=x 'y'`}, ""},
		{`"" ''`, []string{"", ""}, ""},
		{`a"b c"d`, []string{"ab cd"}, ""},
		{`a\ b \"c "d\"e\\f\g" 'h\i'`, []string{"a b", `"c`, `d"e\f\g`, `h\i`}, ""},
		{`"abc`, nil, `unterminated " quote`},
		{`'abc`, nil, "unterminated ' quote"},
		{`abc\`, nil, "ends in a backslash"},
	} {
		got, err := ShellWords(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ShellWords(%s) = %q, %v; want an error saying %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ShellWords(%s) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func TestSplitGoBuild(t *testing.T) {
	vars := map[string]string{"VERSION": "v1.2.3", "TARGETOS": "linux", "TARGETARCH": "arm64"}
	for _, tt := range []struct {
		cmd       string
		env, args []string
		wantErr   string
	}{
		{
			cmd:  `CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=$TARGETARCH go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/tether ./cmd/tether`,
			env:  []string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=arm64"},
			args: []string{"build", "-trimpath", "-ldflags", "-s -w -X main.version=v1.2.3", "-o", "/out/tether", "./cmd/tether"},
		},
		{cmd: "go build ./cmd/tether", args: []string{"build", "./cmd/tether"}},
		// -ldflags=... and ./a=b hold an = but assign no variable.
		{cmd: "go build -ldflags=-s ./a=b", args: []string{"build", "-ldflags=-s", "./a=b"}},
		{cmd: "A=${UNSET}x go build", env: []string{"A=x"}, args: []string{"build"}},
		{cmd: "CGO_ENABLED=0 go vet ./...", wantErr: "is not `[VAR=VALUE]... go build ...`"},
		{cmd: "-X=1 go build", wantErr: "is not `[VAR=VALUE]... go build ...`"},
		{cmd: "A=1", wantErr: "is not `[VAR=VALUE]... go build ...`"},
		{cmd: `go build -ldflags "-X main.version=${VERSION}`, wantErr: "unterminated"},
	} {
		env, args, err := SplitGoBuild(tt.cmd, vars)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("SplitGoBuild(%s) = %q, %q, %v; want an error saying %q", tt.cmd, env, args, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(env, tt.env) || !reflect.DeepEqual(args, tt.args) {
			t.Errorf("SplitGoBuild(%s) = %q, %q, %v; want %q, %q", tt.cmd, env, args, err, tt.env, tt.args)
		}
	}
}
