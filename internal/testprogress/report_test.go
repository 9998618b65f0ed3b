package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The streams in testdata were recorded with go test -json from the packages in testdata/src
// (cd testdata/src && go test -count=1 -json ./pass > ../pass.jsonl; several.jsonl is
// go test -count=1 -json -timeout 5s ./...).
var fixtures = []string{"pass", "fail", "panic", "build", "skip", "notests", "parallel", "timeout", "exit", "several"}

func readFixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name+".jsonl"))
	require.NoError(t, err)
	return b
}

func decode(t *testing.T, stream []byte) []event {
	t.Helper()
	var events []event
	sc := bufio.NewScanner(bytes.NewReader(stream))
	for sc.Scan() {
		var e event
		require.NoError(t, json.Unmarshal(sc.Bytes(), &e), "%s", sc.Bytes())
		events = append(events, e)
	}
	return events
}

// process reports stream and returns what it printed and whether it counted a failure.
func process(t *testing.T, stream []byte, verbose bool) (string, bool) {
	t.Helper()
	var out bytes.Buffer
	r := newReport(&out, verbose)
	require.NoError(t, r.read(bytes.NewReader(stream)))
	return out.String(), r.failed
}

// The exact output for one package of each kind.
func TestReportLines(t *testing.T) {
	cases := map[string]string{
		"pass": "    ok   TestOne (0.00s)\n    ok   TestTwo (0.00s)\nok  \texp/pass\t0.002s\n",
		"skip": "    ok   TestRuns (0.00s)\n    s_test.go:7: needs PostgreSQL: set PGCHANGESTREAM_TEST_DSN\n" +
			"--- SKIP: TestSkipped (0.00s)\nok  \texp/skip\t0.002s\n",
		"notests": "?   \texp/notests\t[no test files]\n",
		"fail": "    ok   TestGood (0.00s)\n=== RUN   TestBad\n    f_test.go:8: context before the failure\n" +
			"=== RUN   TestBad/inner\n    f_test.go:9: inner broke\n--- FAIL: TestBad/inner (0.00s)\n" +
			"--- FAIL: TestBad (0.00s)\nFAIL\nFAIL\texp/fail\t0.002s\n\nfailed:\n    exp/fail TestBad\n",
		"build": "# exp/build [exp/build.test]\nbuild/b_test.go:5:28: undefined: undefinedThing\n" +
			"FAIL\texp/build [build failed]\n\nfailed:\n    exp/build (build failed)\n",
		"exit": "    ok   TestFirst (0.00s)\n=== RUN   TestExits\n    e_test.go:10: leaving\nFAIL\texp/exit\t0.002s\n" +
			"\nfailed:\n    exp/exit (package)\n",
	}
	for name, want := range cases {
		t.Run(name, func(t *testing.T) {
			got, failed := process(t, readFixture(t, name), false)
			require.Equal(t, want, got)
			require.Equal(t, strings.Contains(want, "FAIL"), failed)
		})
	}
}

// Against every recorded stream: each finished top-level test gets its line, a failing one its
// whole output, a failed package its own output and that of the tests it left running, passing
// tests' output stays quiet, and a failure is counted exactly when the stream has one.
func TestReportModel(t *testing.T) {
	for _, name := range fixtures {
		t.Run(name, func(t *testing.T) {
			stream := readFixture(t, name)
			got, failed := process(t, stream, false)
			outputs := map[string][]string{} // by package and top-level test ("" for the package)
			anyFail := false
			for _, e := range decode(t, stream) {
				top, _, sub := strings.Cut(e.Test, "/")
				key := e.Package + "\x00" + top
				switch e.Action {
				case "output":
					outputs[key] = append(outputs[key], e.Output)
				case "build-output":
					outputs[e.ImportPath] = append(outputs[e.ImportPath], e.Output)
				case "build-fail":
					anyFail = true
					requireInOrder(t, got, outputs[e.ImportPath])
				case "pass":
					if e.Test != "" && !sub {
						require.Contains(t, got, "    ok   "+e.Test+" (")
						require.NotContains(t, got, "=== RUN   "+e.Test+"\n")
						delete(outputs, key)
					}
				case "skip":
					if e.Test != "" && !sub {
						require.Contains(t, got, "--- SKIP: "+e.Test+" (")
						delete(outputs, key)
					}
				case "fail":
					anyFail = true
					if sub {
						continue
					}
					requireInOrder(t, got, outputs[key])
					if e.Test == "" { // the tests it left running
						for k, out := range outputs {
							if strings.HasPrefix(k, e.Package+"\x00") {
								requireInOrder(t, got, out)
							}
						}
					}
				}
			}
			require.Equal(t, anyFail, failed)
			require.Equal(t, anyFail, strings.Contains(got, "\nfailed:\n"))
		})
	}
}

// requireInOrder checks that the lines appear in got in their order.
func requireInOrder(t *testing.T, got string, lines []string) {
	t.Helper()
	rest := got
	for _, s := range lines {
		i := strings.Index(rest, s)
		require.GreaterOrEqual(t, i, 0, "missing %q in:\n%s", s, got)
		rest = rest[i+len(s):]
	}
}

// interleave merges two streams line by line, as go test -json does for packages that run at
// the same time.
func interleave(t *testing.T, a, b []byte) []byte {
	t.Helper()
	la := strings.SplitAfter(strings.TrimSuffix(string(a), "\n"), "\n")
	lb := strings.SplitAfter(strings.TrimSuffix(string(b), "\n"), "\n")
	var out strings.Builder
	for i := 0; i < len(la) || i < len(lb); i++ {
		if i < len(la) {
			out.WriteString(strings.TrimSuffix(la[i], "\n") + "\n")
		}
		if i < len(lb) {
			out.WriteString(strings.TrimSuffix(lb[i], "\n") + "\n")
		}
	}
	return []byte(out.String())
}

// Packages that run at the same time print one after the other, in the order they started.
func TestReportGroupsPackages(t *testing.T) {
	for _, verbose := range []bool{false, true} {
		fail, pass := readFixture(t, "parallel"), readFixture(t, "pass")
		got, failed := process(t, interleave(t, fail, pass), verbose)
		first, _ := process(t, fail, verbose)
		second, _ := process(t, pass, verbose)
		summary := first[strings.Index(first, "\nfailed:\n"):]
		require.Equal(t, strings.TrimSuffix(first, summary)+second+summary, got, "verbose %v", verbose)
		require.True(t, failed)
	}
}

// With -v the output is go test's own, every line of it, grouped by package.
func TestReportVerbose(t *testing.T) {
	other := bytes.ReplaceAll(readFixture(t, "skip"), []byte(`"exp/skip"`), []byte(`"exp/other"`))
	stream := interleave(t, readFixture(t, "several"), other)
	got, failed := process(t, stream, true)
	var order []string
	byPkg := map[string]string{}
	var build strings.Builder
	for _, e := range decode(t, stream) {
		switch {
		case e.Action == "build-output":
			build.WriteString(e.Output)
		case e.Action == "output":
			if _, ok := byPkg[e.Package]; !ok {
				order = append(order, e.Package)
			}
			byPkg[e.Package] += e.Output
		}
	}
	want := build.String()
	for _, p := range order {
		want += byPkg[p]
	}
	require.True(t, failed)
	require.Equal(t, want, got[:strings.Index(got, "\nfailed:\n")])
	require.Equal(t, strings.Count(string(stream), `--- PASS`), strings.Count(got, "--- PASS"))
}

// A stream that stops in the middle (the go command died) prints what it has and fails.
func TestReportUnfinished(t *testing.T) {
	stream := readFixture(t, "fail")
	lines := strings.SplitAfter(string(stream), "\n")
	cut := strings.Join(lines[:9], "") // TestBad and its subtest started, nothing ended
	got, failed := process(t, []byte(cut), false)
	require.True(t, failed)
	require.Contains(t, got, "    ok   TestGood (0.00s)\n=== RUN   TestBad\n")
	require.Contains(t, got, "exp/fail (did not finish)")
}

// Lines that are not events pass through.
func TestReportPassesOtherLines(t *testing.T) {
	got, failed := process(t, []byte("not json\n{\"Action\":\"start\",\"Package\":\"x\"}\n{broken\n"), false)
	require.Equal(t, "not json\n{broken\n\nfailed:\n    x (did not finish)\n", got)
	require.True(t, failed)
}

func TestRunExitStatus(t *testing.T) {
	pass := filepath.Join("testdata", "pass.jsonl")
	cases := []struct {
		args []string
		want int
	}{
		{[]string{"cat", pass}, 0},
		{[]string{"cat", filepath.Join("testdata", "fail.jsonl")}, 1},        // the command passed, a test failed
		{[]string{"cat", filepath.Join("testdata", "build.jsonl")}, 1},       // a build failed
		{[]string{"sh", "-c", "cat " + pass + "; echo oops >&2; exit 3"}, 3}, // the command failed
		{[]string{"./no-such-command"}, 2},
		{nil, 2},
	}
	for _, c := range cases {
		var out, errOut bytes.Buffer
		require.Equal(t, c.want, run(c.args, &out, &errOut), "%v: %s%s", c.args, &out, &errOut)
		if c.want == 3 {
			require.Equal(t, "oops\n", errOut.String())
			require.Contains(t, out.String(), "ok  \texp/pass")
		}
	}
}

func TestVerboseFlag(t *testing.T) {
	require.True(t, verbose([]string{"test", "-race", "-json", "-v", "./..."}))
	require.True(t, verbose([]string{"test", "-test.v=true"}))
	require.False(t, verbose([]string{"test", "-race", "-json", "./..."}))
	require.False(t, verbose([]string{"test", "-v=false"}))
}
