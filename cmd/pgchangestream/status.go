package main

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pgchangestream/pgchangestream"
	"github.com/pgchangestream/pgchangestream/admin"
)

// Token formats, as status reports them.
const (
	tokenWithTime = "id+time"  // {"timestamp": ..., "eventID": ...}: what this library writes
	tokenIDOnly   = "id-only"  // {"eventID": ...}: older tokens; the time is the row's changed_at
	tokenRowGone  = "row-gone" // id-only, and the row is gone: the next start replays the table
	// Upgraded changelog: {"timestamp", "eventID"} plus a snapshot.
	tokenSnapshot   = "snapshot"   // "snapshot": every row it sees is passed
	tokenSwitchover = "switchover" // "switchover": from a legacy token, of the rows it sees
	tokenDelta      = "delta"      // "snapshot" with "deltaEnd": inside a delta, up to eventID
	tokenInvalid    = "invalid"    // not a token the watcher can load
)

// clientStatus is one row of the status output.
type clientStatus struct {
	Client       string     `json:"client"`
	Token        string     `json:"token"`
	TokenFormat  string     `json:"token_format"`
	Table        *string    `json:"table"` // the table the token records; null: none
	Stale        bool       `json:"stale"` // not saved for --stale-after
	PositionID   *int64     `json:"position_id"`
	PositionTime *time.Time `json:"position_time"`
	SavedAt      *time.Time `json:"saved_at"`
	AgeSeconds   *float64   `json:"age_seconds"`
	LagSeconds   *float64   `json:"lag_seconds"`
	Backlog      *int64     `json:"backlog"`
	BacklogTable *string    `json:"backlog_table"`
	Error        string     `json:"error,omitempty"`
	// Shared is set for a shared client: the token above is its range's the furthest behind.
	Shared *sharedStatus `json:"shared,omitempty"`
}

// runStatus runs "status".
func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("status", "status [--dsn DSN] [--format table|json] [--table TABLE] [--client-table C=T]... [flags]", `
Lists every client in the token table: its saved position (changelog id and changed_at), when
it was saved, the age of the position (the database's now() minus the position's changed_at;
none for a position before every row, such as a new client's on a table without rows), the lag
and the backlog. The backlog is the number of changelog rows the token does not certify: what
a watcher restarting from it would deliver, counted as Watcher.Backlog and 'prune' count it
(snapshot tokens of an upgraded changelog included). The lag is the age of the oldest of them,
from its changed_at (the start of the transaction that wrote it), 0 when there is none: the
library's Stats.Lag, seen from the saved token. The backlog counts the rows of the table the
client's token records (saved by its watcher); --client-table CLIENT=TABLE names another
(repeatable), --table names it for clients whose token records none, and a client with neither
counts the rows of every table (the backlog_table field is then null).

A shared client (Config.Shared; its positions are those of its ranges) is listed with the token
of its range the furthest behind, whose backlog and lag are what it holds back for 'prune', and
then with its members (id, name, lease left, ranges owned) and its ranges (owner, position, and
age: the database's now() less the position's changed_at, read from the token, not from the
changelog's rows). A shared client without a token-table row is listed too.

Token formats: id+time ({"timestamp", "eventID"}), id-only ({"eventID"}), row-gone (id-only,
its row deleted), snapshot, switchover and delta (upgraded changelog), invalid.

A token not saved for --stale-after is flagged stale: a running watcher saves its token at
least once a minute (Config.CheckpointRefreshInterval) while it has nothing pending, so a stale
token is often one no watcher runs for any more (a mistyped --client, a retired client), and it
holds back 'prune' for its table.

Tokens that hold only an id are shown with the changed_at of their row, looked up in the
changelog; if that row is gone, the watcher replays the table from its beginning, and the
backlog counts every row.`, stdout, stderr)
	dsn := c.dsnFlag()
	format := c.fs.String("format", "table", "table or json")
	table := c.fs.String("table", "", "the table of clients without --client-table (default: rows of every table)")
	var clientTables stringList
	c.fs.Var(&clientTables, "client-table", "CLIENT=TABLE: the table of CLIENT's watcher (repeatable)")
	changelog := c.fs.String("changelog-table", pgchangestream.DefaultChangelogTable, "changelog table")
	tokens := c.fs.String("token-table", pgchangestream.DefaultTokenTable, "table of saved positions")
	staleAfter := staleAfterFlag(c)
	return c.exit(func() error {
		if err := c.parseNoArgs(args); err != nil {
			return err
		}
		if *staleAfter <= 0 {
			return usagef("--stale-after must be positive, got %v", *staleAfter)
		}
		if err := checkChoice("format", *format, "table", "json"); err != nil {
			return err
		}
		tables, err := parseClientTables(clientTables)
		if err != nil {
			return err
		}
		cl, err := quoteTable("changelog-table", *changelog)
		if err != nil {
			return err
		}
		tok, err := quoteTable("token-table", *tokens)
		if err != nil {
			return err
		}
		opts := admin.Options{ChangelogTable: *changelog, TokenTable: *tokens}
		db, err := connectFlagDSN(ctx, *dsn)
		if err != nil {
			return err
		}
		defer db.Close()
		for _, t := range []struct{ name, quoted string }{{*tokens, tok}, {*changelog, cl}} {
			if err := requireTable(ctx, db, "table", t.name, t.quoted); err != nil {
				return err
			}
		}
		rows, err := loadStatus(ctx, db, opts, *staleAfter, func(client, recorded string) string {
			return cmp.Or(tables[client], recorded, *table)
		})
		if err != nil {
			return err
		}
		if *format == "json" {
			return writeJSON(stdout, rows)
		}
		if err := writeStatusTable(stdout, rows); err != nil {
			return err
		}
		var (
			clients []string
			sh      []*sharedStatus
		)
		for _, r := range rows {
			if r.Shared != nil {
				clients, sh = append(clients, r.Client), append(sh, r.Shared)
			}
		}
		return writeSharedTables(stdout, clients, sh)
	}())
}

// parseClientTables parses the --client-table values.
func parseClientTables(values []string) (map[string]string, error) {
	m := make(map[string]string, len(values))
	for _, v := range values {
		client, table, ok := strings.Cut(v, "=")
		if !ok || client == "" || table == "" {
			return nil, usagef("--client-table %q: want CLIENT=TABLE", v)
		}
		m[client] = table
	}
	return m, nil
}

// loadStatus reads every client's token and computes its position, age, lag and backlog, and
// whether it is stale; tableOf names a client's table ("" for every table) from its name and
// the table its token records. Position, backlog and lag are the library's own
// (admin.Backlog): what a watcher restarting from the token would deliver.
func loadStatus(ctx context.Context, db *sql.DB, opts admin.Options, staleAfter time.Duration,
	tableOf func(client, recorded string) string) ([]clientStatus, error) {
	tokens, err := admin.ListTokens(ctx, db, opts)
	if err != nil {
		return nil, err
	}
	shared, err := admin.ListShared(ctx, db, opts)
	if err != nil {
		return nil, err
	}
	tokens = withShared(tokens, shared)
	var now time.Time
	if err := db.QueryRowContext(ctx, `SELECT now()`).Scan(&now); err != nil {
		return nil, fmt.Errorf("read the database's clock: %w", err)
	}
	out := make([]clientStatus, 0, len(tokens))
	for _, t := range tokens {
		s := clientStatus{Client: t.Client, Token: t.Token}
		if i := slices.IndexFunc(shared, func(c admin.SharedClient) bool { return c.Client == t.Client }); i >= 0 {
			s.Shared = newSharedStatus(shared[i], now)
		}
		if !t.UpdatedAt.IsZero() {
			s.SavedAt = &t.UpdatedAt
			s.Stale = now.Sub(t.UpdatedAt) >= staleAfter
		}
		s.TokenFormat, s.Table = tokenFormat(t.Token)
		table := tableOf(s.Client, deref(s.Table))
		b, err := admin.Backlog(ctx, db, t.Token, table, opts)
		switch {
		case errors.Is(err, pgchangestream.ErrInvalidSavedToken):
			s.TokenFormat, s.Error = tokenInvalid, strings.TrimPrefix(err.Error(), pgchangestream.ErrInvalidSavedToken.Error()+": ")
			out = append(out, s)
			continue
		case err != nil:
			return nil, fmt.Errorf("client %s: %w", s.Client, err)
		}
		id, lag := b.Position.ID, math.Round(b.Lag.Seconds()*1000)/1000
		s.PositionID, s.Backlog, s.LagSeconds = &id, &b.Rows, &lag
		if b.RowGone {
			s.TokenFormat = tokenRowGone
		}
		if at := b.Position.ChangedAt; !at.IsZero() { // zero: before every row, no row to date it
			age := math.Round(now.Sub(at).Seconds()*1000) / 1000
			s.PositionTime, s.AgeSeconds = &at, &age
		}
		if table != "" {
			s.BacklogTable = &table
		}
		out = append(out, s)
	}
	return out, nil
}

// tokenFormat names the format of a saved token from the fields it has, and returns the table it
// records (nil for none). Whether it loads is the library's to say.
func tokenFormat(token string) (string, *string) {
	var t struct {
		Timestamp  string `json:"timestamp"`
		Snapshot   string `json:"snapshot"`
		DeltaEnd   string `json:"deltaEnd"`
		Switchover string `json:"switchover"`
		Table      string `json:"table"`
	}
	if json.Unmarshal([]byte(token), &t) != nil {
		return tokenInvalid, nil
	}
	var table *string
	if t.Table != "" {
		table = &t.Table
	}
	switch {
	case t.Timestamp == "":
		return tokenIDOnly, table
	case t.Switchover != "":
		return tokenSwitchover, table
	case t.DeltaEnd != "":
		return tokenDelta, table
	case t.Snapshot != "":
		return tokenSnapshot, table
	}
	return tokenWithTime, table
}

// writeStatusTable writes the rows as an aligned table.
func writeStatusTable(w io.Writer, rows []clientStatus) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "CLIENT\tPOSITION\tPOSITION TIME\tTOKEN\tSAVED\tAGE\tLAG\tBACKLOG")
	for _, s := range rows {
		id, posTime, saved, age, lag, backlog := "-", "-", "-", "-", "-", "-"
		if s.PositionID != nil {
			id = strconv.FormatInt(*s.PositionID, 10)
		}
		if s.PositionTime != nil {
			posTime = s.PositionTime.UTC().Format(eventTimeFormat)
		}
		if s.SavedAt != nil {
			saved = s.SavedAt.UTC().Format(time.RFC3339)
		}
		if s.Stale {
			saved += " (stale)"
		}
		if s.AgeSeconds != nil {
			age = formatAge(time.Duration(*s.AgeSeconds * float64(time.Second)))
		}
		if s.LagSeconds != nil {
			lag = formatAge(time.Duration(*s.LagSeconds * float64(time.Second)))
		}
		if s.Backlog != nil {
			backlog = strconv.FormatInt(*s.Backlog, 10)
			if s.BacklogTable != nil {
				backlog += " (" + *s.BacklogTable + ")"
			}
		}
		format := s.TokenFormat
		if s.Error != "" {
			format += " (" + s.Error + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Client, id, posTime, format, saved, age, lag, backlog)
	}
	return tw.Flush()
}

// deref returns *s, or "" for nil.
func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// formatAge rounds an age for display: milliseconds under a second, seconds above.
func formatAge(d time.Duration) string {
	if d < time.Second && d > -time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}
