// Package dockerfile reads what tether's tools need of a Dockerfile: its
// stages, their instructions, and the `go build` command a stage runs,
// split into its environment and go's arguments as a shell would split it.
//
// It is the one reader for cmd/tether's Dockerfile test and hack/image (the
// image builder), so both see the same file the same way; what each makes
// of it (the checks, what the builder refuses) stays with each. It reads
// the subset of the syntax tether's Dockerfile uses: no heredocs, no escape
// directive. Only those two import it: it is not linked into tether.
package dockerfile

import (
	"fmt"
	"os"
	"strings"
)

// File is a parsed Dockerfile.
type File struct {
	Args   map[string]string // the ARGs before the first FROM, with their defaults ("" if none)
	Stages []Stage           // in order; the last is the default target
}

// Stage is one FROM and the instructions after it.
type Stage struct {
	Name         string // AS NAME; "" if unnamed
	From         string // its image or stage, variables not expanded
	Instructions []Instruction
}

// Instruction is one instruction, its continuation lines joined.
type Instruction struct {
	Cmd   string   // the keyword, upper case: COPY, RUN, ...
	Flags []string // its leading flags, as written: --from=build, --mount=type=cache,...
	Args  string   // the rest, as written (a shell command, JSON, KEY=VALUE words...)
}

// Flag is the value of the flag --name=VALUE, and whether in is given it.
func (in Instruction) Flag(name string) (string, bool) {
	for _, f := range in.Flags {
		if v, ok := strings.CutPrefix(f, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// Stage is the stage named name, or nil.
func (f File) Stage(name string) *Stage {
	for i := range f.Stages {
		if f.Stages[i].Name == name {
			return &f.Stages[i]
		}
	}
	return nil
}

// Build is the command of s's last RUN that runs go build, without its
// flags and variables not expanded; "" if none does.
func (s Stage) Build() string {
	build := ""
	for _, in := range s.Instructions {
		if in.Cmd == "RUN" && strings.Contains(in.Args, "go build") {
			build = in.Args
		}
	}
	return build
}

// Parse reads src. Comments and blank lines are dropped wherever they are,
// even inside a continued instruction, as docker drops them.
func Parse(src string) (File, error) {
	f := File{Args: map[string]string{}}
	cur := ""
	var lines []string
	for l := range strings.Lines(src) {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		if body, ok := strings.CutSuffix(t, `\`); ok {
			cur += strings.TrimSpace(body) + " "
			continue
		}
		lines = append(lines, cur+t)
		cur = ""
	}
	if cur != "" { // a continuation on the last line ends the instruction
		lines = append(lines, strings.TrimSpace(cur))
	}
	for _, l := range lines {
		cmd, rest := cutWord(l)
		in := Instruction{Cmd: strings.ToUpper(cmd)}
		in.Flags, in.Args = cutFlags(rest)
		if in.Cmd == "FROM" {
			st, err := fromStage(in)
			if err != nil {
				return File{}, fmt.Errorf("line %q: %w", l, err)
			}
			f.Stages = append(f.Stages, st)
			continue
		}
		if len(f.Stages) > 0 {
			st := &f.Stages[len(f.Stages)-1]
			st.Instructions = append(st.Instructions, in)
			continue
		}
		if in.Cmd != "ARG" {
			return File{}, fmt.Errorf("%s before the first FROM (only ARG may be)", in.Cmd)
		}
		words, err := ShellWords(in.Args)
		if err != nil {
			return File{}, fmt.Errorf("line %q: %w", l, err)
		}
		for _, w := range words {
			k, v, _ := strings.Cut(w, "=")
			f.Args[k] = v
		}
	}
	if len(f.Stages) == 0 {
		return File{}, fmt.Errorf("no FROM")
	}
	return f, nil
}

// cutFlags splits s into its leading --flags and the rest.
func cutFlags(s string) (flags []string, rest string) {
	rest = strings.TrimSpace(s)
	for strings.HasPrefix(rest, "--") {
		var flag string
		flag, rest = cutWord(rest)
		flags = append(flags, flag)
	}
	return flags, rest
}

// cutWord splits s at its first blank into a word and the rest, trimmed.
func cutWord(s string) (word, rest string) {
	s = strings.TrimSpace(s)
	if i := strings.IndexAny(s, " \t"); i >= 0 {
		return s[:i], strings.TrimSpace(s[i:])
	}
	return s, ""
}

// fromStage reads FROM [--platform=...] IMAGE [AS NAME].
func fromStage(in Instruction) (Stage, error) {
	fields := strings.Fields(in.Args)
	switch {
	case len(fields) == 1:
		return Stage{From: fields[0]}, nil
	case len(fields) == 3 && strings.EqualFold(fields[1], "AS"):
		return Stage{From: fields[0], Name: fields[2]}, nil
	}
	return Stage{}, fmt.Errorf("want FROM IMAGE [AS NAME]")
}

// Expand replaces $NAME and ${NAME} in s with their values in vars ("" if
// not there), as docker expands build arguments.
func Expand(s string, vars map[string]string) string {
	return os.Expand(s, func(k string) string { return vars[k] })
}

// ShellWords splits s into words as a POSIX shell does: blanks separate
// words; single quotes keep everything; double quotes keep everything but a
// backslash before " or \; outside quotes a backslash keeps the next
// character. It expands nothing.
func ShellWords(s string) ([]string, error) {
	var words []string
	var b strings.Builder
	inWord := false
	var quote rune
	escaped := false
	for _, r := range s {
		switch {
		case escaped:
			if quote == '"' && r != '"' && r != '\\' {
				b.WriteRune('\\')
			}
			b.WriteRune(r)
			escaped = false
		case r == '\\' && quote != '\'':
			escaped, inWord = true, true
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			b.WriteRune(r)
		case r == '"' || r == '\'':
			quote, inWord = r, true
		case r == ' ' || r == '\t' || r == '\n':
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
	if quote != 0 {
		return nil, fmt.Errorf("%q: unterminated %c quote", s, quote)
	}
	if escaped {
		return nil, fmt.Errorf("%q: ends in a backslash", s)
	}
	if inWord {
		words = append(words, b.String())
	}
	return words, nil
}

// SplitGoBuild splits a build command `A=1 B=2 go build ARGS...`, its
// variables expanded from vars, into its environment (A=1, B=2) and go's
// arguments (build ARGS...).
func SplitGoBuild(cmd string, vars map[string]string) (env, args []string, err error) {
	words, err := ShellWords(Expand(cmd, vars))
	if err != nil {
		return nil, nil, err
	}
	for len(words) > 0 {
		k, _, ok := strings.Cut(words[0], "=")
		if !ok || !isName(k) {
			break
		}
		env = append(env, words[0])
		words = words[1:]
	}
	if len(words) < 2 || words[0] != "go" || words[1] != "build" {
		return nil, nil, fmt.Errorf("the build command %q is not `[VAR=VALUE]... go build ...`", cmd)
	}
	return env, words[1:], nil
}

// isName reports whether s is a shell variable name.
func isName(s string) bool {
	for i, r := range s {
		if r != '_' && !('a' <= r && r <= 'z') && !('A' <= r && r <= 'Z') && (i == 0 || !('0' <= r && r <= '9')) {
			return false
		}
	}
	return s != ""
}
