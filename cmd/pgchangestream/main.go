// Command pgchangestream streams, inspects and demonstrates pgchangestream change streams.
//
// Usage:
//
//	pgchangestream demo    [flags]            run writers and a crashing consumer, check no row is lost
//	pgchangestream tail    --table T [flags]  stream a table's changes to stdout
//	pgchangestream status  [flags]            list the saved positions, lag and backlog of all clients
//	pgchangestream token   list|reset|delete  list, move or delete saved tokens
//	pgchangestream prune   [flags]            delete the changelog rows every client has passed
//	pgchangestream parked  list|retry|drop    list, rerun or drop the events Process parked
//	pgchangestream schema  install|capture    create the changelog schema, capture a table
//	pgchangestream grants  revoke-writers|restrict-reads|restrict-tokens|unrestrict
//	                                          least-privilege grants and row-level security
//
// Every subcommand takes --help. Exit codes: 0 success, 1 runtime failure, 2 usage error.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal gets the default behaviour: exit at once
	}()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// mainUsage is the usage text of the command itself.
const mainUsage = `Usage: pgchangestream <command> [flags]

Commands:
  demo            start writers and a consumer that crashes and restarts; check that every
                  written row was delivered
  tail            stream the changes of one table to stdout; with --client, acknowledge
                  them and save the position under that name
  status          list every client's saved position, its lag and the rows after it
  token list      list every client's saved token
  token reset     move a client's saved position (beginning, newest, a time, an id)
  token delete    delete a client's saved token
  prune           delete the changelog rows every client has passed
  parked list     list the events Process parked after their handler kept failing
  parked retry    run a parked event again (for a blocked key: all its parked events)
  parked drop     delete a parked event without running it
  schema install  create the changelog table, the token table and the trigger function
  schema capture  attach the trigger function to a table
  grants          print the REVOKEs of old writer grants; restrict a role to its tables'
                  changelog rows or its clients' tokens (row-level security)

Run 'pgchangestream <command> --help' for the flags of a command.
Exit codes: 0 success, 1 runtime failure, 2 usage error.
`

// run runs the command line args (without the program name) and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, mainUsage)
		return exitUsage
	}
	switch cmd, rest := args[0], args[1:]; cmd {
	case "demo":
		return runDemo(ctx, rest, stdout, stderr)
	case "tail":
		return runTail(ctx, rest, stdout, stderr)
	case "status":
		return runStatus(ctx, rest, stdout, stderr)
	case "schema":
		return runSchema(ctx, rest, stdout, stderr)
	case "token":
		return runToken(ctx, rest, stdout, stderr)
	case "prune":
		return runPrune(ctx, rest, stdout, stderr)
	case "parked":
		return runParked(ctx, rest, stdout, stderr)
	case "grants":
		return runGrants(ctx, rest, stdout, stderr)
	case "help", "-h", "-help", "--help":
		if len(rest) > 0 && rest[0] != "help" {
			return run(ctx, append(rest[:len(rest):len(rest)], "--help"), stdout, stderr)
		}
		fmt.Fprint(stdout, mainUsage)
		return exitOK
	default:
		fmt.Fprintf(stderr, "%s: unknown command %q (commands: demo, tail, status, token, prune, parked, schema, grants; see '%s --help')\n",
			prog, cmd, prog)
		return exitUsage
	}
}
