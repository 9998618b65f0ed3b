package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// event is one line of `go test -json` (see `go doc test2json`).
type event struct {
	Action      string
	Package     string
	Test        string
	Output      string
	Elapsed     float64
	ImportPath  string // build-output and build-fail
	FailedBuild string // a package's fail: the build that failed
}

// report turns a stream of events into progress lines.
type report struct {
	out     io.Writer
	verbose bool
	pkgs    map[string]*pkg
	order   []*pkg              // started packages not yet printed in full; order[0] streams
	build   map[string][]string // build output by ImportPath, printed when that build fails
	failed  bool
	// failures names what failed, for the closing summary.
	failures []string
}

// pkg is the state of one package's test run.
type pkg struct {
	name   string
	held   bytes.Buffer // what it printed while another package streamed
	head   bool         // it streams: what it prints goes straight out
	tests  map[string]*test
	names  []string // the running top-level tests, in the order they started
	output []string // its own output, not a test's
	failed []string // top-level tests that failed
	done   bool
}

// test is the output of a running top-level test and its subtests.
type test struct{ output []string }

func newReport(out io.Writer, verbose bool) *report {
	return &report{out: out, verbose: verbose, pkgs: map[string]*pkg{}, build: map[string][]string{}}
}

// read reports every event of r until it ends. A line that is not an event is printed as is.
// Packages still running at the end print what they have and count as failed.
func (r *report) read(in io.Reader) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil || e.Action == "" {
			fmt.Fprintf(r.out, "%s\n", line)
			continue
		}
		r.event(e)
	}
	r.finish()
	return sc.Err()
}

func (r *report) event(e event) {
	switch e.Action {
	case "build-output":
		if r.verbose {
			fmt.Fprint(r.out, e.Output)
		} else {
			r.build[e.ImportPath] = append(r.build[e.ImportPath], e.Output)
		}
		return
	case "build-fail":
		r.failed = true
		r.write(r.build[e.ImportPath])
		delete(r.build, e.ImportPath)
		return
	}
	if e.Package == "" {
		return
	}
	p := r.pkg(e.Package)
	if e.Test == "" {
		r.pkgEvent(p, e)
		return
	}
	name, _, sub := strings.Cut(e.Test, "/")
	if e.Action == "output" {
		if r.verbose {
			r.print(p, e.Output)
			return
		}
		t := p.tests[name]
		if t == nil {
			t = &test{}
			p.tests[name] = t
			p.names = append(p.names, name)
		}
		t.output = append(t.output, e.Output)
		return
	}
	if sub || (e.Action != "pass" && e.Action != "fail" && e.Action != "skip") {
		return
	}
	if e.Action == "fail" {
		p.failed = append(p.failed, name)
		r.failures = append(r.failures, e.Package+" "+name)
	}
	t := p.tests[name]
	p.end(name)
	if r.verbose {
		return
	}
	var output []string
	if t != nil {
		output = t.output
	}
	switch e.Action {
	case "pass":
		r.print(p, fmt.Sprintf("    ok   %s (%.2fs)\n", name, e.Elapsed))
	case "skip": // go test's own "--- SKIP" line and the reason, without the run lines
		for _, s := range output {
			if !strings.HasPrefix(s, "=== ") {
				r.print(p, s)
			}
		}
	case "fail":
		for _, s := range output {
			r.print(p, s)
		}
	}
}

// pkgEvent handles an event of the package itself, not of one of its tests.
func (r *report) pkgEvent(p *pkg, e event) {
	switch e.Action {
	case "output":
		if r.verbose {
			r.print(p, e.Output)
		} else {
			p.output = append(p.output, e.Output)
		}
	case "pass", "skip": // skip: no test files
		if !r.verbose {
			for _, s := range p.output {
				if e.Action == "skip" || strings.HasPrefix(s, "ok ") {
					r.print(p, s) // go test's closing line; the rest stays quiet, as go test keeps it
				}
			}
		}
		r.close(p)
	case "fail":
		switch {
		case e.FailedBuild != "":
			r.failures = append(r.failures, e.Package+" (build failed)")
		case len(p.failed) == 0: // a panic or exit outside a test, a timeout, TestMain
			r.failures = append(r.failures, e.Package+" (package)")
		}
		r.failPkg(p)
	}
}

// failPkg prints everything a failed package has not printed yet: the output of tests that
// never finished (running at a panic, a timeout or an exit) and its own output.
func (r *report) failPkg(p *pkg) {
	r.failed = true
	if !r.verbose {
		for _, name := range p.names {
			for _, s := range p.tests[name].output {
				r.print(p, s)
			}
		}
		for _, s := range p.output {
			r.print(p, s)
		}
	}
	r.close(p)
}

// finish ends the report at the end of the stream: packages that did not finish failed (the
// command died), build output that no failure claimed is printed, then the summary.
func (r *report) finish() {
	for len(r.order) > 0 { // order[0] is never done: close moves past the done ones
		p := r.order[0]
		r.failures = append(r.failures, p.name+" (did not finish)")
		r.failPkg(p)
	}
	for _, output := range r.build {
		r.write(output)
	}
	if len(r.failures) > 0 {
		fmt.Fprintf(r.out, "\nfailed:\n")
		for _, f := range r.failures {
			fmt.Fprintf(r.out, "    %s\n", f)
		}
	}
}

// pkg returns the state of package name, starting it if it is new.
func (r *report) pkg(name string) *pkg {
	p := r.pkgs[name]
	if p == nil {
		p = &pkg{name: name, tests: map[string]*test{}}
		r.pkgs[name] = p
		r.order = append(r.order, p)
		p.head = len(r.order) == 1
	}
	return p
}

// print writes s for p: out now if p streams, later otherwise.
func (r *report) print(p *pkg, s string) {
	if p.head {
		fmt.Fprint(r.out, s)
		return
	}
	p.held.WriteString(s)
}

// write writes output out now.
func (r *report) write(output []string) {
	for _, s := range output {
		fmt.Fprint(r.out, s)
	}
}

// close marks p done; if it streamed, the next packages print what they held, and the first
// one still running streams from then on.
func (r *report) close(p *pkg) {
	p.done = true
	for len(r.order) > 0 && r.order[0].done {
		r.order = r.order[1:]
		if len(r.order) == 0 {
			return
		}
		next := r.order[0]
		next.head = true
		_, _ = next.held.WriteTo(r.out)
	}
}

// end forgets the running top-level test name.
func (p *pkg) end(name string) {
	delete(p.tests, name)
	for i, n := range p.names {
		if n == name {
			p.names = append(p.names[:i], p.names[i+1:]...)
			return
		}
	}
}
