package test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestOneOfEachKind holds the repository to one reader of each kind: the
// tests wait and check for leaks through internal/testkit, event streams
// are read through internal/sse, JSON is scanned through internal/jsonscan,
// and no port is reserved and released before use. A second one written
// anywhere fails here, naming the file and line.
func TestOneOfEachKind(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if name := d.Name(); rel != "." && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		if rel == filepath.Join("test", "layout_test.go") {
			return nil // its rules name what they look for
		}
		checkOneOfEachKind(t, fset, filepath.ToSlash(rel), f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("read %d Go files under %s: not the repository", files, root)
	}
}

// TestInternalImportsOnlyInternal holds the packages under internal/ to
// building blocks: none imports a package of this module outside
// internal/ (the wire contract, a part, the policy), tests included. What
// such a package needs of them is passed in, or the package lives beside
// what it serves.
func TestInternalImportsOnlyInternal(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	var module string
	for l := range strings.Lines(string(gomod)) {
		if m, ok := strings.CutPrefix(strings.TrimSpace(l), "module "); ok {
			module = strings.Trim(strings.TrimSpace(m), `"`)
			break
		}
	}
	if module == "" {
		t.Fatal("go.mod names no module")
	}
	fset := token.NewFileSet()
	files := 0
	err = filepath.WalkDir(filepath.Join(root, "internal"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		files++
		rel, _ := filepath.Rel(root, path)
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if outsideInternal(module, p) {
				t.Errorf("%s:%d: imports %s, outside %s/internal", filepath.ToSlash(rel), fset.Position(imp.Pos()).Line, p, module)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 20 {
		t.Fatalf("read %d Go files under %s/internal: not the repository's", files, root)
	}
}

// outsideInternal reports whether import path p is a package of module
// outside its internal/ tree.
func outsideInternal(module, p string) bool {
	if p != module && !strings.HasPrefix(p, module+"/") {
		return false // the standard library or another module
	}
	return p != module+"/internal" && !strings.HasPrefix(p, module+"/internal/")
}

func TestOutsideInternal(t *testing.T) {
	const m = "example.com/mod"
	for p, want := range map[string]bool{
		"strings":                           false,
		"github.com/nats-io/nats.go":        false,
		"example.com/module/subjects":       false, // another module that shares a prefix
		"example.com/mod/internal/sse":      false,
		"example.com/mod/internal/sse/more": false,
		"example.com/mod/internal":          false,
		"example.com/mod":                   true,
		"example.com/mod/subjects":          true,
		"example.com/mod/subjects/reply":    true,
		"example.com/mod/internalish":       true,
		"example.com/mod/broker/internal/x": true,
	} {
		if got := outsideInternal(m, p); got != want {
			t.Errorf("outsideInternal(%q) = %v, want %v", p, got, want)
		}
	}
}

func checkOneOfEachKind(t *testing.T, fset *token.FileSet, rel string, f *ast.File) {
	t.Helper()
	dir := filepath.ToSlash(filepath.Dir(rel))
	test := strings.HasSuffix(rel, "_test.go")
	at := func(n ast.Node) string { return rel + ":" + strconv.Itoa(fset.Position(n.Pos()).Line) }

	for _, imp := range f.Imports {
		if imp.Path.Value == `"go.uber.org/goleak"` && dir != "internal/testkit" {
			t.Errorf("%s: imports goleak; leak checks go through testkit.Main or testkit.NoGoroutinesLeft", at(imp))
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncDecl:
			switch strings.ToLower(n.Name.Name) {
			case "freeport", "freeports":
				t.Errorf("%s: %s reserves a port and releases it; hand the listener over (testkit.Listen, fd:N) or let the server report its port", at(n), n.Name.Name)
			}
		case *ast.ForStmt:
			if test && dir != "internal/testkit" && sleeps(n.Body) {
				t.Errorf("%s: a poll loop of its own (a for loop that sleeps); tests poll with testkit.CheckFor or testkit.Poll", at(n))
			}
		case *ast.CallExpr:
			pkg, fn := callee(n)
			if pkg != "bytes" && pkg != "strings" {
				return true
			}
			for _, a := range n.Args {
				if conv, ok := a.(*ast.CallExpr); ok && len(conv.Args) == 1 {
					a = conv.Args[0] // []byte("data:")
				}
				lit, ok := a.(*ast.BasicLit)
				if !ok {
					continue
				}
				v, _ := strconv.Unquote(lit.Value)
				switch {
				case !test && dir != "internal/sse" && readsSSE(fn, v):
					t.Errorf("%s: %s.%s(…, %s) reads an event stream by hand; use internal/sse", at(n), pkg, fn, lit.Value)
				case !test && dir != "internal/jsonscan" && fn == "IndexByte" && v == `"`:
					t.Errorf("%s: looks for a JSON string's quote by hand; use internal/jsonscan", at(n))
				case strings.HasPrefix(v, "text/event-stream") && dir != "internal/sse":
					t.Errorf("%s: recognises the media type by hand; use sse.IsEventStream", at(n))
				}
			}
		}
		return true
	})
}

// sleeps reports whether a for loop's own body calls time.Sleep: a loop
// that goes on until something holds (or a time passes), sleeping between
// looks, is a poll loop whatever its function is called. A range loop
// that sleeps paces a fixed number of steps (a slow engine's chunks) and
// is not one. A function literal in the body runs elsewhere (a goroutine,
// a callback) and is not looked into.
func sleeps(body *ast.BlockStmt) bool {
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.CallExpr:
			if pkg, fn := callee(n); pkg == "time" && fn == "Sleep" {
				found = true
			}
		}
		return !found
	})
	return found
}

// readsSSE reports whether a bytes or strings call with this literal
// argument takes a stream's lines apart (writing "data: " is not reading).
func readsSSE(fn, lit string) bool {
	switch fn {
	case "HasPrefix", "CutPrefix", "TrimPrefix", "Cut", "Index", "Contains":
		return strings.HasPrefix(lit, "data:") || strings.HasPrefix(lit, "event:")
	}
	return false
}

// callee is the package and function of a call like bytes.HasPrefix(…).
func callee(c *ast.CallExpr) (pkg, fn string) {
	sel, ok := c.Fun.(*ast.SelectorExpr)
	if !ok {
		return "", ""
	}
	id, ok := sel.X.(*ast.Ident)
	if !ok {
		return "", ""
	}
	return id.Name, sel.Sel.Name
}

// TestDocsCiteTestsThatExist: every test the docs name as the proof of a
// rule (a `TestName` in backquotes in docs/ or the README) is a test
// function of the repository, so a test removed or renamed cannot leave a
// rule proved by nothing.
func TestDocsCiteTestsThatExist(t *testing.T) {
	citedTest := regexp.MustCompile("`(Test[A-Z][A-Za-z0-9_]*)")
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Test") {
				have[fn.Name.Name] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	docs = append(docs, filepath.Join(root, "README.md"))
	cited := 0
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range citedTest.FindAllStringSubmatch(string(b), -1) {
			cited++
			if !have[m[1]] {
				t.Errorf("%s cites %s, which no _test.go file defines", filepath.Base(doc), m[1])
			}
		}
	}
	if cited < 50 {
		t.Fatalf("found %d tests cited in the docs: not the docs", cited)
	}
}
