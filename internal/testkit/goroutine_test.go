package testkit

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// TestNoFailNowOffTheTestGoroutine fails when code that may end a test with
// FailNow runs on a goroutine other than the test's own. testing.T.FailNow
// (behind Fatal, Fatalf, Skip, Skipf and SkipNow) stops only the goroutine
// that calls it: called elsewhere, the test carries on past the failure, or
// the goroutine exits while the test waits for it forever. go vet's
// testinggoroutine analyzer sees only direct calls in a `go` statement of
// the test function itself; this check follows the repository's helpers.
//
// The rule is syntactic (no type checking, so it needs no dependency and
// runs in a second), over every .go file of the repository, the bench
// module included:
//
//   - A stopper is a method call named Fatal, Fatalf, FailNow, Skip, Skipf
//     or SkipNow on anything but an imported package (t.Fatal, h.t.Fatalf,
//     b.Skip; log.Fatal is a package function and not a stopper), or any
//     function of testify's require package.
//   - A function or method declared in the repository may stop when its
//     body calls a stopper or a function that may stop, outside the code it
//     hands to other goroutines (below) or to t.Run and t.Cleanup, which run
//     it where FailNow is allowed. Calls resolve by name: f() to f in the
//     same package, pkg.F() to F in that repository package, x.m() to T's
//     method m when x is plainly a T (the receiver, a parameter,
//     x := &T{...}, var x T), and otherwise to any method m declared in
//     the same package or in a repository package the file imports,
//     whatever x's type: a false positive is cheap to avoid by renaming, a
//     false negative is a hung or falsely green test. A local
//     `name := func...` that may stop counts too; a function value passed
//     in as a parameter is not followed.
//   - Code off the test goroutine is: the function of a `go` statement,
//     function literals passed to a method named Go (errgroup.Group.Go,
//     sync.WaitGroup.Go) or to time.AfterFunc, and function literals with
//     an HTTP handler's parameters (http.ResponseWriter, *http.Request),
//     which run on the server's goroutines. Such code must not call
//     anything that may stop; it reports with t.Error and returns, or
//     sends its error to the test goroutine.
func TestNoFailNowOffTheTestGoroutine(t *testing.T) {
	root := repoRoot(t)
	r := newRepoIndex(t, root)
	r.computeMayStop()
	var problems []string
	for _, f := range r.files {
		problems = append(problems, r.offGoroutineStops(f)...)
	}
	sort.Strings(problems)
	for _, p := range problems {
		t.Error(p)
	}
}

// The check must see what it is meant to catch: each case is a file that
// either stops off the test goroutine (want a report) or does not.
func TestNoFailNowOffTheTestGoroutineCatches(t *testing.T) {
	for _, tt := range []struct {
		name string
		src  string
		want bool
	}{
		{"direct", `func TestX(t *testing.T) { go func() { t.Fatal("x") }() }`, true},
		{"through a field", `func (h *h) f() { go func() { h.t.Fatalf("x") }() }`, true},
		{"skip", `func TestX(t *testing.T) { go func() { t.Skip() }() }`, true},
		{"through a helper", `func help(t *testing.T) { t.Helper(); t.Fatal("x") }
func TestX(t *testing.T) { go func() { help(t) }() }`, true},
		{"through two helpers", `func help(t *testing.T) { t.Fatal("x") }
func help2(t *testing.T) { help(t) }
func TestX(t *testing.T) { go help2(t) }`, true},
		{"through a method", `func (h *harness) connect() { h.t.Fatal("x") }
func TestX(t *testing.T) { h := &harness{}; go func() { h.connect() }() }`, true},
		{"through a local func", `func TestX(t *testing.T) { check := func() { t.Fatal("x") }; go func() { check() }() }`, true},
		{"waitgroup Go", `func TestX(t *testing.T) { var wg sync.WaitGroup; wg.Go(func() { t.FailNow() }) }`, true},
		{"AfterFunc", `func TestX(t *testing.T) { time.AfterFunc(0, func() { t.Fatal() }) }`, true},
		{"handler", `func TestX(t *testing.T) { http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { t.Fatal() }) }`, true},
		{"nested literal", `func TestX(t *testing.T) { go func() { defer func() { t.Fatal() }() }() }`, true},
		{"testify require", `func TestX(t *testing.T) { go func() { require.NoError(t, nil) }() }`, true},

		{"error is fine", `func TestX(t *testing.T) { go func() { t.Error("x") }() }`, false},
		{"on the test goroutine", `func TestX(t *testing.T) { t.Fatal("x"); go func() {}() }`, false},
		{"subtest", `func TestX(t *testing.T) { go func() { t.Run("a", func(t *testing.T) { t.Fatal() }) }() }`, false},
		{"log.Fatal is not FailNow", `func main() { go func() { log.Fatal("x") }() }`, false},
		{"helper that only reports", `func help(t *testing.T) { t.Error("x") }
func TestX(t *testing.T) { go func() { help(t) }() }`, false},
		{"cleanup", `func help(t *testing.T) { t.Cleanup(func() { t.Fatal() }) }
func TestX(t *testing.T) { go func() { help(t) }() }`, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			src := "package p\n\nimport (\n\t\"log\"\n\t\"net/http\"\n\t\"sync\"\n\t\"testing\"\n\t\"time\"\n\n\t\"github.com/stretchr/testify/require\"\n)\n\n" + tt.src + "\n"
			r := &repoIndex{root: "/r", modules: map[string]string{}, mayStop: map[string]bool{}, decls: map[string][]*ast.FuncDecl{}}
			if err := r.add(t.Name(), "/r/p/p_test.go", []byte(src)); err != nil {
				t.Fatal(err)
			}
			r.computeMayStop()
			got := r.offGoroutineStops(r.files[0])
			if (len(got) > 0) != tt.want {
				t.Errorf("reports %q, want a report: %v", got, tt.want)
			}
		})
	}
}

// stopperNames are testing.TB's methods that call runtime.Goexit.
var stopperNames = map[string]bool{"Fatal": true, "Fatalf": true, "FailNow": true, "Skip": true, "Skipf": true, "SkipNow": true}

// requirePackages are imported packages whose every function may FailNow.
var requirePackages = map[string]bool{"github.com/stretchr/testify/require": true}

// scope is what resolves names in one function declaration: its file,
// its local function literals that may stop, and the types of the
// variables whose type is plain from the syntax (receiver, parameters,
// x := &T{...}, var x T), keyed by name.
type scope struct {
	f      *repoFile
	locals map[string]bool
	vars   map[string]string
}

type repoFile struct {
	fset    *token.FileSet
	file    *ast.File
	pkg     string            // import path of the file's package
	imports map[string]string // local name -> import path
}

type repoIndex struct {
	root    string
	modules map[string]string // module root dir -> module path
	files   []*repoFile
	// decls are the repository's functions and methods by key: "pkg.F"
	// for a function, "pkg.(T.M)" for T's method M.
	decls map[string][]*ast.FuncDecl
	// mayStop holds the keys of decls that may stop, and "pkg.(M)" when
	// any method named M in pkg may.
	mayStop map[string]bool
	// declFile maps each declaration to its file.
	declFile map[*ast.FuncDecl]*repoFile
}

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.HasPrefix(b, []byte("module github.com/tether-mcp/tether\n")) {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod of github.com/tether-mcp/tether above the test's directory")
		}
		dir = parent
	}
}

func newRepoIndex(t *testing.T, root string) *repoIndex {
	t.Helper()
	r := &repoIndex{root: root, modules: map[string]string{}, decls: map[string][]*ast.FuncDecl{}, mayStop: map[string]bool{}}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules" || d.Name() == "vendor") {
				return filepath.SkipDir
			}
			if b, err := os.ReadFile(filepath.Join(path, "go.mod")); err == nil {
				first, _, _ := bytes.Cut(b, []byte("\n"))
				r.modules[path] = strings.TrimSpace(strings.TrimPrefix(string(first), "module"))
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return r.add(r.importPath(filepath.Dir(path)), path, src)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.files) < 50 {
		t.Fatalf("found only %d Go files under %s: the walk is broken", len(r.files), root)
	}
	return r
}

// importPath is dir's import path, from the nearest go.mod above it.
func (r *repoIndex) importPath(dir string) string {
	for d := dir; ; d = filepath.Dir(d) {
		if mod, ok := r.modules[d]; ok {
			rel, _ := filepath.Rel(d, dir)
			if rel == "." {
				return mod
			}
			return mod + "/" + filepath.ToSlash(rel)
		}
		if d == r.root || d == filepath.Dir(d) {
			return dir
		}
	}
}

func (r *repoIndex) add(pkg, path string, src []byte) error {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
	if err != nil {
		return err
	}
	rf := &repoFile{fset: fset, file: f, pkg: pkg, imports: map[string]string{}}
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		name := p[strings.LastIndex(p, "/")+1:]
		if imp.Name != nil {
			name = imp.Name.Name
		} else if strings.HasPrefix(name, "v") && strings.Count(p, "/") > 0 {
			// A major-version suffix (go-redis/v9) is not the package name.
			if _, err := strconv.Atoi(name[1:]); err == nil {
				q := strings.TrimSuffix(p, "/"+name)
				name = q[strings.LastIndex(q, "/")+1:]
			}
		}
		rf.imports[name] = p
	}
	r.files = append(r.files, rf)
	if r.declFile == nil {
		r.declFile = map[*ast.FuncDecl]*repoFile{}
	}
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		r.decls[declKey(pkg, fd)] = append(r.decls[declKey(pkg, fd)], fd)
		r.declFile[fd] = rf
	}
	return nil
}

func declKey(pkg string, fd *ast.FuncDecl) string {
	if fd.Recv != nil {
		return pkg + ".(" + typeName(fd.Recv.List[0].Type) + "." + fd.Name.Name + ")"
	}
	return pkg + "." + fd.Name.Name
}

// anyMethodKey stands for every method named name in pkg.
func anyMethodKey(pkg, name string) string { return pkg + ".(" + name + ")" }

// typeName is T for T, *T, T[P] and *T[P]; "" for anything else.
func typeName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.StarExpr:
		return typeName(e.X)
	case *ast.UnaryExpr:
		return typeName(e.X)
	case *ast.IndexExpr:
		return typeName(e.X)
	case *ast.IndexListExpr:
		return typeName(e.X)
	case *ast.CompositeLit:
		return typeName(e.Type)
	}
	return ""
}

// setVar records that name is a T; a name declared with two types in one
// function (in different blocks) is unknown, so every method of its name
// counts.
func (sc *scope) setVar(name, T string) {
	if old, seen := sc.vars[name]; seen && old != T {
		T = ""
	}
	sc.vars[name] = T
}

// newScope resolves names in fd.
func (r *repoIndex) newScope(f *repoFile, fd *ast.FuncDecl) *scope {
	sc := &scope{f: f, locals: map[string]bool{}, vars: map[string]string{}}
	var fields []*ast.Field
	if fd.Recv != nil {
		fields = append(fields, fd.Recv.List...)
	}
	fields = append(fields, fd.Type.Params.List...)
	for _, field := range fields {
		for _, n := range field.Names {
			sc.setVar(n.Name, typeName(field.Type))
		}
	}
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.ValueSpec:
			for _, id := range n.Names {
				sc.setVar(id.Name, typeName(n.Type))
			}
		case *ast.AssignStmt:
			if n.Tok != token.DEFINE || len(n.Lhs) != len(n.Rhs) {
				return true
			}
			for i, rhs := range n.Rhs {
				id, ok := n.Lhs[i].(*ast.Ident)
				if !ok {
					continue
				}
				sc.setVar(id.Name, typeName(rhs))
				if lit, ok := rhs.(*ast.FuncLit); ok && r.bodyMayStop(sc, lit.Body) != "" {
					sc.locals[id.Name] = true
				}
			}
		}
		return true
	})
	return sc
}

// computeMayStop marks, to a fixed point, every declaration whose body may
// call FailNow on its caller's goroutine.
func (r *repoIndex) computeMayStop() {
	for changed := true; changed; {
		changed = false
		for key, fds := range r.decls {
			if r.mayStop[key] {
				continue
			}
			for _, fd := range fds {
				if r.bodyMayStop(r.newScope(r.declFile[fd], fd), fd.Body) != "" {
					r.mayStop[key], changed = true, true
					if fd.Recv != nil {
						r.mayStop[anyMethodKey(r.declFile[fd].pkg, fd.Name.Name)] = true
					}
					break
				}
			}
		}
	}
}

// bodyMayStop returns the first call in body, run on body's own goroutine,
// that may stop it ("" if none).
func (r *repoIndex) bodyMayStop(sc *scope, body ast.Node) string {
	var found string
	ast.Inspect(body, func(n ast.Node) bool {
		if found != "" {
			return false
		}
		switch n := n.(type) {
		case *ast.GoStmt:
			return false // another goroutine: checked on its own
		case *ast.FuncLit:
			return !isHandler(n) // a handler runs on the server's goroutines
		case *ast.CallExpr:
			if name := r.callMayStop(sc, n); name != "" {
				found = name
				return false
			}
			if elsewhere := r.offGoroutineArgs(sc.f, n); len(elsewhere) > 0 || isSelector(n.Fun, "Run", "Cleanup") {
				// Walk the call's other parts, not the literals it
				// hands to another goroutine or to t.Run/t.Cleanup.
				found = r.bodyMayStop(sc, n.Fun)
				for _, a := range n.Args {
					if _, lit := a.(*ast.FuncLit); lit {
						continue
					}
					if s := r.bodyMayStop(sc, a); s != "" && found == "" {
						found = s
					}
				}
				return false
			}
		}
		return true
	})
	return found
}

// callMayStop names call when it may stop the goroutine that makes it.
func (r *repoIndex) callMayStop(sc *scope, call *ast.CallExpr) string {
	f := sc.f
	switch fun := call.Fun.(type) {
	case *ast.Ident:
		if sc.locals[fun.Name] || r.mayStop[f.pkg+"."+fun.Name] {
			return fun.Name
		}
	case *ast.SelectorExpr:
		name := fun.Sel.Name
		if x, ok := fun.X.(*ast.Ident); ok {
			if path, isPkg := f.imports[x.Name]; isPkg {
				if requirePackages[path] || r.mayStop[path+"."+name] {
					return x.Name + "." + name
				}
				return ""
			}
		}
		if stopperNames[name] {
			return exprString(fun)
		}
		if x, ok := fun.X.(*ast.Ident); ok && sc.vars[x.Name] != "" {
			// The receiver's type is known: that type's method only.
			if r.mayStop[f.pkg+".("+sc.vars[x.Name]+"."+name+")"] {
				return exprString(fun)
			}
			return ""
		}
		if r.mayStop[anyMethodKey(f.pkg, name)] {
			return exprString(fun)
		}
		for _, path := range f.imports {
			if r.mayStop[anyMethodKey(path, name)] {
				return exprString(fun)
			}
		}
	}
	return ""
}

// offGoroutineArgs are the function literals call runs on another
// goroutine: the argument of x.Go(...) and of time.AfterFunc.
func (r *repoIndex) offGoroutineArgs(f *repoFile, call *ast.CallExpr) []*ast.FuncLit {
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return nil
	}
	pkg := ""
	if x, ok := sel.X.(*ast.Ident); ok {
		pkg = f.imports[x.Name]
	}
	if sel.Sel.Name != "Go" && !(pkg == "time" && sel.Sel.Name == "AfterFunc") {
		return nil
	}
	var lits []*ast.FuncLit
	for _, a := range call.Args {
		if lit, ok := a.(*ast.FuncLit); ok {
			lits = append(lits, lit)
		}
	}
	return lits
}

// offGoroutineStops reports every call in f that may stop a goroutine
// other than the test's.
func (r *repoIndex) offGoroutineStops(f *repoFile) []string {
	var problems []string
	report := func(where ast.Node, what, call string) {
		problems = append(problems, fmt.Sprintf("%s: %s calls %s, which may call FailNow off the test goroutine; report with t.Error and return, or send the error to the test goroutine",
			f.fset.Position(where.Pos()), what, call))
	}
	for _, d := range f.file.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Body == nil {
			continue
		}
		sc := r.newScope(f, fd)
		ast.Inspect(fd.Body, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt:
				if lit, ok := n.Call.Fun.(*ast.FuncLit); ok {
					if s := r.bodyMayStop(sc, lit.Body); s != "" {
						report(n, "a go statement", s)
					}
				} else if s := r.callMayStop(sc, n.Call); s != "" {
					report(n, "a go statement", s)
				}
			case *ast.CallExpr:
				for _, lit := range r.offGoroutineArgs(sc.f, n) {
					if s := r.bodyMayStop(sc, lit.Body); s != "" {
						report(lit, "a function run on another goroutine by "+exprString(n.Fun), s)
					}
				}
			case *ast.FuncLit:
				if isHandler(n) {
					if s := r.bodyMayStop(sc, n.Body); s != "" {
						report(n, "an HTTP handler", s)
					}
				}
			}
			return true
		})
	}
	return problems
}

// isHandler reports whether lit has an HTTP handler's parameters.
func isHandler(lit *ast.FuncLit) bool {
	var types []string
	for _, field := range lit.Type.Params.List {
		n := max(len(field.Names), 1)
		for range n {
			types = append(types, exprString(field.Type))
		}
	}
	return len(types) == 2 && types[0] == "http.ResponseWriter" && types[1] == "*http.Request"
}

func isSelector(e ast.Expr, names ...string) bool {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	for _, n := range names {
		if sel.Sel.Name == n {
			return true
		}
	}
	return false
}

func exprString(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return exprString(e.X) + "." + e.Sel.Name
	case *ast.StarExpr:
		return "*" + exprString(e.X)
	case *ast.CallExpr:
		return exprString(e.Fun) + "(...)"
	case *ast.IndexExpr:
		return exprString(e.X) + "[...]"
	}
	return fmt.Sprintf("%T", e)
}
