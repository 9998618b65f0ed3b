package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/pgchangestream/pgchangestream"
	"github.com/pgchangestream/pgchangestream/admin"
)

// parkedUsage is the usage text of "parked" without a subcommand.
const parkedUsage = `Usage: pgchangestream parked list [--client CLIENT] [flags]
       pgchangestream parked retry CLIENT ID [flags]
       pgchangestream parked drop CLIENT ID [--dry-run | --yes] [flags]

  list   list the events Process parked in the dead-letter table
  retry  ask the client's running Process to run a parked event again (for an event parked
         under BlockOnFailure: every parked event of its key, in order)
  drop   delete a parked event without running it again

Run 'pgchangestream parked <subcommand> --help' for flags.
`

// runParked runs "parked list", "parked retry" or "parked drop".
func runParked(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return dispatch(ctx, "parked", parkedUsage, []subcommand{
		{"list", runParkedList}, {"retry", runParkedRetry}, {"drop", runParkedDrop},
	}, args, stdout, stderr)
}

// listedParked is one event of "parked list --format json".
type listedParked struct {
	ID          int64           `json:"id"`
	Client      string          `json:"client"`
	Key         string          `json:"key"`
	Table       string          `json:"table"`
	ChangelogID int64           `json:"changelog_id"`
	Error       string          `json:"error"`
	Attempts    int             `json:"attempts"`
	Blocking    bool            `json:"blocking"`
	Retry       bool            `json:"retry_requested"`
	ParkedAt    time.Time       `json:"parked_at"`
	Event       json.RawMessage `json:"event"`
}

// runParkedList runs "parked list".
func runParkedList(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("parked list", "parked list [--client CLIENT] [--dsn DSN] [--format table|json] [flags]", `
Lists the parked events of every client (of CLIENT with --client), oldest first: the events
whose handler kept failing under ParkOnFailure or BlockOnFailure. A blocking event holds its
key: the key's later events are parked behind it until it is retried or dropped. --format json
includes each event's document.`, stdout, stderr)
	f := addAdminFlags(c)
	client := c.fs.String("client", "", "list only this client's events")
	format := c.fs.String("format", "table", "table or json")
	return c.exit(func() error {
		if err := c.parseNoArgs(args); err != nil {
			return err
		}
		if err := checkChoice("format", *format, "table", "json"); err != nil {
			return err
		}
		db, err := f.connect(ctx)
		if err != nil {
			return err
		}
		defer db.Close()
		parked, err := admin.ListParked(ctx, db, *client, f.opts)
		if err != nil {
			return err
		}
		if *format == "json" {
			out := make([]listedParked, len(parked))
			for i, p := range parked {
				doc, err := json.Marshal(p.Event)
				if err != nil {
					return fmt.Errorf("parked event %d: %w", p.ID, err)
				}
				out[i] = listedParked{ID: p.ID, Client: p.Client, Key: p.Key, Table: p.Table, ChangelogID: p.ChangelogID,
					Error: p.Error, Attempts: p.Attempts, Blocking: p.Blocking, Retry: p.RetryRequested,
					ParkedAt: p.ParkedAt, Event: doc}
			}
			return writeJSON(stdout, out)
		}
		tw := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tCLIENT\tKEY\tTABLE\tCHANGELOG ID\tATTEMPTS\tBLOCKING\tRETRY\tPARKED\tERROR")
		for _, p := range parked {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d\t%t\t%t\t%s\t%s\n", p.ID, p.Client, p.Key, p.Table, p.ChangelogID,
				p.Attempts, p.Blocking, p.RetryRequested, p.ParkedAt.UTC().Format(time.RFC3339), p.Error)
		}
		return tw.Flush()
	}())
}

// parkedArgs returns the positional arguments CLIENT and ID.
func parkedArgs(c *command, args []string) (string, int64, error) {
	args, err := c.parse(args)
	switch {
	case err != nil:
		return "", 0, err
	case len(args) < 2:
		return "", 0, usagef("want CLIENT and ID")
	case len(args) > 2:
		return "", 0, usagef("unexpected argument %q: CLIENT and ID only", args[2])
	}
	id, err := strconv.ParseInt(args[1], 10, 64)
	if err != nil || id <= 0 {
		return "", 0, usagef("ID %q is not a parked event id (see 'parked list')", args[1])
	}
	return args[0], id, nil
}

// runParkedRetry runs "parked retry CLIENT ID".
func runParkedRetry(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("parked retry", "parked retry CLIENT ID [--dsn DSN] [flags]", `
Marks CLIENT's parked event ID to be run again. The client's running Process picks it up at its
next look at the dead-letter table (ProcessOptions.ParkedPollInterval): on success the event
leaves the table; on failure it is parked again. For an event parked under BlockOnFailure this
releases its key: every parked event of the key runs again in order, then the key's new events.`,
		stdout, stderr)
	f := addAdminFlags(c)
	return c.exit(func() error {
		client, id, err := parkedArgs(c, args)
		if err != nil {
			return err
		}
		db, err := f.connect(ctx)
		if err != nil {
			return err
		}
		defer db.Close()
		if err := admin.RetryParked(ctx, db, client, id, f.opts); err != nil {
			return err
		}
		_, err = fmt.Fprintf(stdout, "parked event %d of client %s will run again\n", id, client)
		return err
	}())
}

// runParkedDrop runs "parked drop CLIENT ID".
func runParkedDrop(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("parked drop", "parked drop CLIENT ID [--dry-run | --yes] [flags]", `
Deletes CLIENT's parked event ID: its handler never runs for it again. A key held under
BlockOnFailure stays held while it has other parked events; once the last is gone, the key's
new events run. It needs --yes, or --dry-run to print the event only.`, stdout, stderr)
	f := addAdminFlags(c)
	dryRun, yes := confirmFlags(c)
	return c.exit(func() error {
		client, id, err := parkedArgs(c, args)
		if err != nil {
			return err
		}
		if err := checkConfirm(*dryRun, *yes, "deletes the parked event"); err != nil {
			return err
		}
		db, err := f.connect(ctx)
		if err != nil {
			return err
		}
		defer db.Close()
		if *dryRun {
			parked, err := admin.ListParked(ctx, db, client, f.opts)
			if err != nil {
				return err
			}
			for _, p := range parked {
				if p.ID == id {
					_, err := fmt.Fprintf(stdout, "would drop parked event %d of client %s: changelog id %d of %s, key %s, error %s\n",
						id, client, p.ChangelogID, p.Table, p.Key, p.Error)
					return err
				}
			}
			return fmt.Errorf("%w: client %q has no parked event %d", pgchangestream.ErrNotParked, client, id)
		}
		if err := admin.DropParked(ctx, db, client, id, f.opts); err != nil {
			return err
		}
		_, err = fmt.Fprintf(stdout, "dropped parked event %d of client %s\n", id, client)
		return err
	}())
}
