// Package doccheck_test compiles every Go block of the documentation, so that no snippet in
// README.md or docs/*.md stops compiling when the code changes.
//
// A block is one of four kinds:
//
//   - preceded by a line `<!-- example: FILE FUNC -->`: it must be the body of the function
//     FUNC in FILE (dedented by one tab), an example that go test compiles and, with an Output
//     comment, runs;
//   - starting with `package`: a whole file, compiled as it is; it must be gofmt-formatted, and
//     other blocks may import it by its package name;
//   - parsing as top-level declarations: compiled in a file of their own;
//   - anything else: statements, compiled as the body of a function.
//
// Declarations and statements get the imports of the package names they use, from the
// imports table below, and may start with import lines of their own. Statements may use the
// placeholders below without declaring them. The store-client packages of docs/migrating.md
// stand for their local copies in internal/storeclient. Blocks that use an adapter module
// (prometheus, otel) are compiled in that module, the others in this one. The generated packages live in
// temporary directories starting with "_" (ignored by ./... patterns) and are removed after
// the test; compiler errors name the documentation file and line through //line directives.
package doccheck_test

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// root is the module root, relative to this package.
const root = "../.."

// modulePath is the import path of the module root.
const modulePath = "github.com/pgchangestream/pgchangestream"

// storeClientPaths maps the store-client import paths in the docs to their local copies.
var storeClientPaths = strings.NewReplacer(
	"github.com/nvidia/nvsentinel/store-client/pkg/", modulePath+"/internal/storeclient/")

// imports maps the package names snippets use to their import paths.
var imports = map[string]string{
	"context":            "context",
	"errors":             "errors",
	"fmt":                "fmt",
	"log":                "log",
	"slog":               "log/slog",
	"sql":                "database/sql",
	"testing":            "testing",
	"time":               "time",
	"pgchangestream":     modulePath,
	"pgchangestreamtest": modulePath + "/pgchangestreamtest",
	"admin":              modulePath + "/admin",
	"pgprom":             modulePath + "/prometheus",
	"pgotel":             modulePath + "/otel",
	"metric":             "go.opentelemetry.io/otel/metric",
	"trace":              "go.opentelemetry.io/otel/trace",
	"prometheus":         "github.com/prometheus/client_golang/prometheus",
	"require":            "github.com/stretchr/testify/require",
	"client":             modulePath + "/internal/storeclient/client",
	"datastore":          modulePath + "/internal/storeclient/datastore",
	"watcher":            modulePath + "/internal/storeclient/watcher",
}

// submodules are the modules of the adapters, by directory, with the imports only they have:
// a block that uses one is compiled in that module.
var submodules = map[string][]string{
	"prometheus": {modulePath + "/prometheus", "github.com/prometheus/client_golang/prometheus"},
	"otel":       {modulePath + "/otel", "go.opentelemetry.io/otel/metric", "go.opentelemetry.io/otel/trace"},
}

// placeholders are the variables statements may use without declaring them.
var placeholders = map[string]string{
	"ctx":            "context.Context",
	"cfg":            "pgchangestream.Config",
	"meterProvider":  "metric.MeterProvider",
	"tracerProvider": "trace.TracerProvider",
	"db":             "*sql.DB",
	"dsn":            "string",
	"t":              "*testing.T",
	"w":              "*pgchangestream.Watcher",
	"pipeline":       "datastore.Pipeline",
	"ds":             "datastore.DataStore",
}

// block is one ```go block of a documentation file.
type block struct {
	file    string // relative to the module root
	line    int    // of the first line of code
	text    string // dedented to the fence
	example string // "FILE FUNC" of the example it shows, if any
}

var (
	fenceOpen  = regexp.MustCompile("^([ \t]*)```go[ \t]*$")
	fenceClose = regexp.MustCompile("^[ \t]*```[ \t]*$")
	exampleRef = regexp.MustCompile(`^<!-- example: (\S+ \w+) -->$`)
)

// docFiles returns the documentation files whose Go blocks are checked.
func docFiles(t *testing.T) []string {
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	out := []string{"README.md"}
	for _, f := range files {
		rel, err := filepath.Rel(root, f)
		require.NoError(t, err)
		out = append(out, filepath.ToSlash(rel))
	}
	return out
}

// goBlocks returns the ```go blocks of the documentation file name.
func goBlocks(t *testing.T, name string) []block {
	data, err := os.ReadFile(filepath.Join(root, name))
	require.NoError(t, err)
	lines := strings.Split(string(data), "\n")
	var out []block
	for i := 0; i < len(lines); i++ {
		m := fenceOpen.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		b := block{file: name, line: i + 2}
		if prev := previousLine(lines, i); exampleRef.MatchString(prev) {
			b.example = exampleRef.FindStringSubmatch(prev)[1]
		}
		var code []string
		for i++; i < len(lines) && !fenceClose.MatchString(lines[i]); i++ {
			code = append(code, strings.TrimPrefix(lines[i], m[1]))
		}
		require.Less(t, i, len(lines), "%s:%d: the go block is not closed", name, b.line-1)
		b.text = strings.Join(code, "\n") + "\n"
		out = append(out, b)
	}
	return out
}

// previousLine returns the last non-blank line before line i.
func previousLine(lines []string, i int) string {
	for i--; i >= 0; i-- {
		if s := strings.TrimSpace(lines[i]); s != "" {
			return s
		}
	}
	return ""
}

// TestDocSnippetsCompile compiles every go block of README.md and docs/*.md, and checks that
// each block naming an example is that example's body.
func TestDocSnippetsCompile(t *testing.T) {
	var blocks []block
	for _, f := range docFiles(t) {
		blocks = append(blocks, goBlocks(t, f)...)
	}
	require.NotEmpty(t, blocks)

	tmp, err := os.MkdirTemp(root, "_doccheck")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(tmp) })
	subTmp := map[string]string{} // submodule -> its temporary directory
	for _, m := range sortedKeys(submodules) {
		dir, err := os.MkdirTemp(filepath.Join(root, m), "_doccheck")
		require.NoError(t, err)
		t.Cleanup(func() { os.RemoveAll(dir) })
		subTmp[m] = dir
	}

	// Whole files first: the other blocks may import them.
	local := map[string]string{} // package name -> import path
	for _, b := range blocks {
		if b.example == "" && strings.HasPrefix(b.text, "package ") {
			name := strings.Fields(b.text)[1]
			local[name] = modulePath + "/" + filepath.Base(tmp) + "/" + name
		}
	}

	pkgs := map[string][]string{} // module directory ("" for the root) -> packages to build
	for i, b := range blocks {
		where := fmt.Sprintf("%s:%d", b.file, b.line)
		var dir, src string
		switch {
		case b.example != "":
			checkExample(t, b)
			continue
		case strings.HasPrefix(b.text, "package "):
			formatted, err := format.Source([]byte(b.text))
			require.NoError(t, err, where)
			if got, want := strings.Split(b.text, "\n"), strings.Split(string(formatted), "\n"); !slices.Equal(got, want) {
				n := 0
				for n < min(len(got), len(want)) && got[n] == want[n] {
					n++
				}
				t.Errorf("%s:%d: the block is not gofmt-formatted: gofmt gives %q here", b.file, b.line+n, want[min(n, len(want)-1)])
			}
			dir = strings.Fields(b.text)[1]
			src = fmt.Sprintf("//line %s\n%s", where, storeClientPaths.Replace(b.text))
		default:
			dir = fmt.Sprintf("s%d", i)
			src = fragment(t, b, dir, local)
		}
		module, base := "", tmp
		for _, m := range sortedKeys(submodules) {
			if slices.ContainsFunc(submodules[m], func(p string) bool { return strings.Contains(src, `"`+p+`"`) }) {
				module, base = m, subTmp[m]
			}
		}
		require.NoError(t, os.MkdirAll(filepath.Join(base, dir), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(base, dir, "snippet.go"), []byte(src), 0o644))
		pkgs[module] = append(pkgs[module], "./"+filepath.Base(base)+"/"+dir)
	}
	for _, m := range sortedKeys(pkgs) {
		build(t, filepath.Join(root, m), pkgs[m])
	}
}

// build compiles pkgs in the module at dir and reports the compiler's errors.
func build(t *testing.T, dir string, pkgs []string) {
	if len(pkgs) == 0 {
		return
	}
	cmd := exec.Command("go", append([]string{"build"}, pkgs...)...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("a Go block of the docs does not compile (%v):\n%s", err, out)
	}
}

// fragment returns the file of package pkg that compiles the declarations or statements of b,
// with the imports it uses and, for statements, the placeholders.
func fragment(t *testing.T, b block, pkg string, local map[string]string) string {
	where := fmt.Sprintf("%s:%d", b.file, b.line)
	lines := strings.Split(b.text, "\n")
	var own []string // the block's import lines
	for len(lines) > 0 && strings.HasPrefix(lines[0], "import ") {
		own = append(own, storeClientPaths.Replace(lines[0]))
		lines = lines[1:]
	}
	body := fmt.Sprintf("//line %s:%d\n%s", b.file, b.line+len(own), strings.Join(lines, "\n"))

	var src string
	if _, err := parser.ParseFile(token.NewFileSet(), "", "package p\n"+body, 0); err == nil {
		src = body
	} else {
		var vars strings.Builder
		for _, name := range sortedKeys(placeholders) {
			if regexp.MustCompile(`\b` + name + `\b`).MatchString(body) {
				fmt.Fprintf(&vars, "var %s %s\n", name, placeholders[name])
			}
		}
		src = fmt.Sprintf("%s\nfunc _() {\n%s\n}\n", vars.String(), body)
	}

	file, err := parser.ParseFile(token.NewFileSet(), "", "package p\n"+src, 0)
	require.NoError(t, err, "%s: the block parses neither as declarations nor as statements", where)
	named := map[string]bool{}
	for _, line := range own {
		f := strings.Fields(line)
		if len(f) == 3 {
			named[f[1]] = true
		} else {
			named[filepath.Base(strings.Trim(f[1], `"`))] = true
		}
	}
	used := map[string]bool{}
	ast.Inspect(file, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok {
				used[id.Name] = true
			}
		}
		return true
	})
	var head bytes.Buffer
	fmt.Fprintf(&head, "package %s\n\n", pkg)
	for _, line := range own {
		fmt.Fprintln(&head, line)
	}
	for _, name := range sortedKeys(used) {
		path, ok := local[name]
		if !ok {
			path, ok = imports[name]
		}
		if ok && !named[name] {
			fmt.Fprintf(&head, "import %s %q\n", name, path)
		}
	}
	return head.String() + src
}

// checkExample checks that b is the body of the function it names.
func checkExample(t *testing.T, b block) {
	file, fn, _ := strings.Cut(b.example, " ")
	path := filepath.Join(root, file)
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
	require.NoError(t, err)
	src, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, d := range f.Decls {
		if d, ok := d.(*ast.FuncDecl); ok && d.Recv == nil && d.Name.Name == fn {
			body := string(src[fset.Position(d.Body.Lbrace).Offset+2 : fset.Position(d.Body.Rbrace).Offset])
			var want strings.Builder
			for _, line := range strings.SplitAfter(body, "\n") {
				want.WriteString(strings.TrimPrefix(line, "\t"))
			}
			assert.Equal(t, want.String(), b.text, "%s:%d shows %s of %s", b.file, b.line, fn, file)
			return
		}
	}
	t.Errorf("%s:%d: %s has no function %s", b.file, b.line, file, fn)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
