package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// Exit codes of every subcommand.
const (
	exitOK      = 0 // success, or --help
	exitFailure = 1 // runtime failure: database unreachable, query failed, rows lost
	exitUsage   = 2 // unknown subcommand, missing or invalid flags
)

// prog is the name used in usage text and error lines.
const prog = "pgchangestream"

// envDSN is read when --dsn is not given.
const envDSN = "PGCHANGESTREAM_DSN"

// getenv reads the environment; a variable so that tests can replace it.
var getenv = os.Getenv

// usageError is a problem with the command line: it exits with exitUsage.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// usagef returns a usageError.
func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// command is one subcommand's command line: its flags and its usage text.
type command struct {
	name     string // "tail", "schema install"
	synopsis string // after "Usage: pgchangestream "
	about    string // paragraphs printed after the synopsis
	fs       *flag.FlagSet
	stdout   io.Writer
	stderr   io.Writer
}

// newCommand returns a command whose flag set reports errors to the caller instead of printing.
func newCommand(name, synopsis, about string, stdout, stderr io.Writer) *command {
	fs := flag.NewFlagSet(prog+" "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &command{name: name, synopsis: synopsis, about: about, fs: fs, stdout: stdout, stderr: stderr}
}

// parse parses args, allowing flags after positional arguments (schema capture TABLE --dsn X),
// and returns the positional arguments. --help returns flag.ErrHelp.
func (c *command) parse(args []string) ([]string, error) {
	var positional []string
	for {
		if err := c.fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, &usageError{msg: err.Error()}
		}
		rest := c.fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		if rest[0] == "--" {
			return append(positional, rest[1:]...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// parseNoArgs parses args for a command that takes no positional argument: one is a usage
// error. --help returns flag.ErrHelp.
func (c *command) parseNoArgs(args []string) error {
	args, err := c.parse(args)
	if err != nil {
		return err
	}
	if len(args) > 0 {
		return usagef("unexpected argument %q", args[0])
	}
	return nil
}

// checkChoice returns a usage error unless value, given as --name, is one of choices.
func checkChoice(name, value string, choices ...string) error {
	if slices.Contains(choices, value) {
		return nil
	}
	return usagef("--%s %q is not one of %s", name, value, strings.Join(choices, ", "))
}

// usage writes the synopsis, the description and the flags to w.
func (c *command) usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: %s %s\n\n%s\n", prog, c.synopsis, strings.TrimSpace(c.about))
	var flags []*flag.Flag
	c.fs.VisitAll(func(f *flag.Flag) { flags = append(flags, f) })
	if len(flags) == 0 {
		return
	}
	fmt.Fprintf(w, "\nFlags:\n")
	for _, f := range flags {
		name, text := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if name != "" {
			line += " " + name
		}
		fmt.Fprintf(w, "%s\n    \t%s", line, strings.ReplaceAll(text, "\n", "\n    \t"))
		if showDefault(f) {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "  -h, --help\n    \tprint this help and exit\n")
}

// showDefault reports whether a flag's default is worth printing.
func showDefault(f *flag.Flag) bool {
	switch f.DefValue {
	case "", "false", "0", "0s":
		return false
	}
	return true
}

// exit reports err and returns the exit code: help goes to stdout (0), a usage error and a
// runtime failure each take one line on stderr (2 and 1).
func (c *command) exit(err error) int {
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		c.usage(c.stdout)
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(c.stderr, "%s: %s: %s (see '%s %s --help')\n", prog, c.name, oneLine(ue.msg), prog, c.name)
		return exitUsage
	default:
		// The library's errors start with the program's name too: say it once.
		msg := strings.ReplaceAll(err.Error(), prog+": ", "")
		fmt.Fprintf(c.stderr, "%s: %s: %s\n", prog, c.name, oneLine(msg))
		return exitFailure
	}
}

// warn writes a warning line to stderr.
func (c *command) warn(format string, args ...any) {
	fmt.Fprintf(c.stderr, "%s: %s: warning: %s\n", prog, c.name, oneLine(fmt.Sprintf(format, args...)))
}

// oneLine folds a multi-line message into one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}

// dsnFlag adds --dsn to c.
func (c *command) dsnFlag() *string {
	return c.fs.String("dsn", "", "PostgreSQL connection string, URL or key=value (default $"+envDSN+")")
}

// resolveDSN returns the --dsn value, else $PGCHANGESTREAM_DSN, else a usage error.
func resolveDSN(flagValue string) (string, error) {
	if flagValue != "" {
		return flagValue, nil
	}
	if v := getenv(envDSN); v != "" {
		return v, nil
	}
	return "", usagef("--dsn is required (or set %s)", envDSN)
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// positiveDuration returns a usage error unless d > 0.
func positiveDuration(name string, d time.Duration) error {
	if d <= 0 {
		return usagef("--%s must be positive, got %v", name, d)
	}
	return nil
}

// subcommand is one subcommand of a command group ("token list").
type subcommand struct {
	name string
	run  func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

// dispatch runs the subcommand of group named by args[0], or prints usage for --help.
func dispatch(ctx context.Context, group, usage string, subs []subcommand, args []string, stdout, stderr io.Writer) int {
	names := make([]string, len(subs))
	for i, s := range subs {
		names[i] = s.name
	}
	want := strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
	if len(args) == 0 {
		fmt.Fprintf(stderr, "%s: %s: missing subcommand: %s (see '%s %s --help')\n", prog, group, want, prog, group)
		return exitUsage
	}
	for _, s := range subs {
		if s.name == args[0] {
			return s.run(ctx, args[1:], stdout, stderr)
		}
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fmt.Fprintf(stderr, "%s: %s: unknown subcommand %q: want %s (see '%s %s --help')\n", prog, group, args[0], want, prog, group)
	return exitUsage
}
