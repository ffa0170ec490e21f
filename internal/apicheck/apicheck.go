// Package apicheck lists the exported API of Runnel's public packages, one
// line per exported identifier, field and method, in the spirit of Go's own
// api/*.txt files. The list is checked in (api/runnel.txt at the module
// root); TestAPI fails when the packages' API differs from it, so that a
// change of the public API, a break above all, is a decision written down in
// the same commit (update the file and CHANGELOG.md), never an accident.
// TestAPI also fails when a third-party Kafka client's type (Sarama,
// franz-go) appears in the API of the packages an app is written with: a
// client change must not be a change of Runnel's API.
//
// apicheck must never import the packages it lists (it reads their compiled
// export data), so that it lists what a user's compiler sees.
package apicheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
)

// Module is the module path of Runnel.
const Module = "github.com/runnel-dev/runnel"

// Public lists the packages whose exported API is checked, relative to
// Module.
var Public = []string{
	"agent", "agent/source", "app", "assignor", "changelog", "client", "codec",
	"partition", "replay", "runneltest", "sources/kafkashare", "sources/nats", "stores", "table", "topology",
}

// AppFacing lists the packages an app is written and tested with: no type of
// a Kafka client library may appear in their API (issue #29).
var AppFacing = []string{"app", "agent", "table", "runneltest", "replay", "codec"}

// ClientLibraries are the import paths (prefixes) of the Kafka client
// libraries Runnel uses inside.
var ClientLibraries = []string{"github.com/IBM/sarama", "github.com/twmb/franz-go"}

// List returns the sorted API lines of the packages (paths relative to
// Module), type-checked from the export data `go list -export` gives, run in
// dir (a directory of the module).
func List(dir string, pkgs []string) ([]string, error) {
	full := make([]string, len(pkgs))
	for i, p := range pkgs {
		full[i] = Module + "/" + p
	}
	cmd := exec.Command("go", append([]string{"list", "-export", "-deps", "-json=ImportPath,Export"}, full...)...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -export: %w: %s", err, stderr.String())
	}
	exports := map[string]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct{ ImportPath, Export string }
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("go list -export: %w", err)
		}
		exports[p.ImportPath] = p.Export
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok || f == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	var lines []string
	for _, p := range full {
		pkg, err := imp.Import(p)
		if err != nil {
			return nil, fmt.Errorf("import %s: %w", p, err)
		}
		lines = append(lines, packageLines(pkg)...)
	}
	sort.Strings(lines)
	return slices.Compact(lines), nil
}

// qualifier prints a package of the module by its path inside it
// ("agent/source") and any other by its full import path, so that a
// third-party type is found by its path.
func qualifier(p *types.Package) string {
	if rel, ok := strings.CutPrefix(p.Path(), Module+"/"); ok {
		return rel
	}
	return p.Path()
}

func packageLines(pkg *types.Package) []string {
	name := strings.TrimPrefix(pkg.Path(), Module+"/")
	prefix := "pkg " + name + ", "
	var out []string
	add := func(s string) { out = append(out, prefix+s) }
	str := func(t types.Type) string { return types.TypeString(t, qualifier) }
	scope := pkg.Scope()
	for _, n := range scope.Names() {
		obj := scope.Lookup(n)
		if !obj.Exported() {
			continue
		}
		switch o := obj.(type) {
		case *types.Const:
			add("const " + n + " " + str(o.Type()))
		case *types.Var:
			add("var " + n + " " + str(o.Type()))
		case *types.Func:
			add("func " + n + signature(o.Type().(*types.Signature), true))
		case *types.TypeName:
			out = append(out, typeLines(prefix, o)...)
		}
	}
	return out
}

// signature prints sig without parameter names (they are no part of the
// API): "[K any](context.Context, K) (int64, error)".
func signature(sig *types.Signature, withTypeParams bool) string {
	var b strings.Builder
	if withTypeParams && sig.TypeParams().Len() > 0 {
		var tp []string
		for i := range sig.TypeParams().Len() {
			p := sig.TypeParams().At(i)
			tp = append(tp, p.Obj().Name()+" "+types.TypeString(p.Constraint(), qualifier))
		}
		b.WriteString("[" + strings.Join(tp, ", ") + "]")
	}
	tuple := func(t *types.Tuple, variadic bool) string {
		var ps []string
		for i := range t.Len() {
			ty := t.At(i).Type()
			if variadic && i == t.Len()-1 {
				ps = append(ps, "..."+types.TypeString(ty.(*types.Slice).Elem(), qualifier))
				continue
			}
			ps = append(ps, types.TypeString(ty, qualifier))
		}
		return strings.Join(ps, ", ")
	}
	b.WriteString("(" + tuple(sig.Params(), sig.Variadic()) + ")")
	switch r := sig.Results(); r.Len() {
	case 0:
	case 1:
		b.WriteString(" " + tuple(r, false))
	default:
		b.WriteString(" (" + tuple(r, false) + ")")
	}
	return b.String()
}

func typeLines(prefix string, tn *types.TypeName) []string {
	var out []string
	head := "type " + tn.Name()
	if tn.IsAlias() {
		return []string{prefix + head + " = " + types.TypeString(types.Unalias(tn.Type()), qualifier)}
	}
	named, ok := tn.Type().(*types.Named)
	if !ok {
		return []string{prefix + head + " " + types.TypeString(tn.Type(), qualifier)}
	}
	if tps := named.TypeParams(); tps.Len() > 0 {
		var tp []string
		for i := range tps.Len() {
			p := tps.At(i)
			tp = append(tp, p.Obj().Name()+" "+types.TypeString(p.Constraint(), qualifier))
		}
		head += "[" + strings.Join(tp, ", ") + "]"
	}
	switch u := named.Underlying().(type) {
	case *types.Struct:
		out = append(out, prefix+head+" struct")
		for _, f := range exportedFields(u, nil) {
			out = append(out, prefix+head+" struct, "+f)
		}
	case *types.Interface:
		out = append(out, prefix+head+" interface")
		hidden := false
		for i := range u.NumMethods() {
			m := u.Method(i)
			if !m.Exported() {
				hidden = true
				continue
			}
			out = append(out, prefix+head+" interface, "+m.Name()+signature(m.Type().(*types.Signature), false))
		}
		for i := range u.NumEmbeddeds() {
			if e := u.EmbeddedType(i); !isInterface(e) {
				out = append(out, prefix+head+" interface, "+types.TypeString(e, qualifier))
			}
		}
		if hidden {
			out = append(out, prefix+head+" interface, unexported methods")
		}
		return out
	default:
		out = append(out, prefix+head+" "+types.TypeString(u, qualifier))
	}
	// The method set of *T: methods declared on T and *T and those promoted
	// from embedded fields, exported ones only (what a user can call).
	ms := types.NewMethodSet(types.NewPointer(named))
	vs := types.NewMethodSet(named)
	for i := range ms.Len() {
		sel := ms.At(i)
		m := sel.Obj().(*types.Func)
		if !m.Exported() {
			continue
		}
		recv := "*" + tn.Name()
		if vs.Lookup(m.Pkg(), m.Name()) != nil {
			recv = tn.Name()
		}
		out = append(out, prefix+"method ("+recv+") "+m.Name()+signature(m.Type().(*types.Signature), false))
	}
	return out
}

func isInterface(t types.Type) bool {
	_, ok := t.Underlying().(*types.Interface)
	return ok
}

// exportedFields lists the exported fields of s a user can select: its own
// and those promoted through embedded fields (exported or not).
func exportedFields(s *types.Struct, seen map[*types.Struct]bool) []string {
	if seen == nil {
		seen = map[*types.Struct]bool{}
	}
	if seen[s] {
		return nil
	}
	seen[s] = true
	var out []string
	for i := range s.NumFields() {
		f := s.Field(i)
		if f.Exported() {
			if f.Embedded() {
				out = append(out, "embedded "+types.TypeString(f.Type(), qualifier))
			} else {
				out = append(out, f.Name()+" "+types.TypeString(f.Type(), qualifier))
			}
		}
		if f.Embedded() {
			t := f.Type()
			if p, ok := t.(*types.Pointer); ok {
				t = p.Elem()
			}
			if es, ok := t.Underlying().(*types.Struct); ok {
				for _, pf := range exportedFields(es, seen) {
					if !strings.HasPrefix(pf, "embedded ") {
						out = append(out, pf)
					}
				}
			}
		}
	}
	return out
}

// ClientTypes returns the lines of an API listing that name a type of one of
// ClientLibraries.
func ClientTypes(lines []string) []string {
	var out []string
	for _, l := range lines {
		for _, lib := range ClientLibraries {
			if strings.Contains(l, lib) {
				out = append(out, l)
				break
			}
		}
	}
	return out
}
