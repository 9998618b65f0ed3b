// Command testprogress runs a `go test -json` command and prints its progress as it goes: a
// line per top-level test and per package as each finishes, and the whole output of every test
// and package that fails. It exits non-zero when the command does or when anything failed (a
// test, a build, a panic, a timeout, a package whose binary exited early).
//
//	go run ./internal/testprogress go test -race -json ./...
//
// With -v among the command's arguments it prints go test's own verbose output instead,
// unchanged. Either way the output is grouped by package in the order they started, as go test
// prints it: the oldest unfinished package streams, the others are held until it is done. The
// command's standard error is passed through as it comes.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs the command args, reports its output on stdout and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: testprogress go test -json [flags] [packages]")
		return 2
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stderr = os.Stdin, stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(stderr, "testprogress:", err)
		return 2
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, "testprogress:", err)
		return 2
	}
	r := newReport(stdout, verbose(args[1:]))
	readErr := r.read(out)
	err = cmd.Wait()
	if readErr != nil {
		fmt.Fprintln(stderr, "testprogress: reading the test output:", readErr)
	}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return max(exit.ExitCode(), 1) // -1 when killed by a signal
	case err != nil:
		fmt.Fprintln(stderr, "testprogress:", err)
		return 1
	case readErr != nil || r.failed:
		return 1
	}
	return 0
}

// verbose reports whether the go test arguments ask for verbose output.
func verbose(args []string) bool {
	for _, a := range args {
		switch a {
		case "-v", "-v=true", "--v", "--v=true", "-test.v", "-test.v=true":
			return true
		}
	}
	return false
}
