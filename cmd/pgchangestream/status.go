package main

import (
	"bytes"
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pgchangestream/pgchangestream"
)

// Token formats, as status reports them.
const (
	tokenWithTime = "id+time"  // {"timestamp": ..., "eventID": ...}: what this library writes
	tokenIDOnly   = "id-only"  // {"eventID": ...}: older tokens; the time is the row's changed_at
	tokenRowGone  = "row-gone" // id-only, and the row is gone: the next start replays the table
	tokenInvalid  = "invalid"  // not a token the watcher can load
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
}

// runStatus runs "status".
func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newCommand("status", "status [--dsn DSN] [--format table|json] [--table TABLE] [--client-table C=T]... [flags]", `
Lists every client in the token table: its saved position (changelog id and changed_at), when
it was saved, the age of the position (the database's now() minus the position's changed_at),
the lag and the backlog. The backlog is the number of changelog rows after the position; the
lag is the age of the oldest of them, from its changed_at (the start of the transaction that
wrote it), 0 when there is none: the same lag as the library's Stats.Lag, seen from the saved
position. The backlog counts the rows of the table the client's token records (saved by its
watcher); --client-table CLIENT=TABLE names another (repeatable), --table names it for clients
whose token records none, and a client with neither counts the rows of every table (the
backlog_table field is then null).

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
		rows, err := loadStatus(ctx, db, cl, tok, *staleAfter, func(client, recorded string) string {
			return cmp.Or(tables[client], recorded, *table)
		})
		if err != nil {
			return err
		}
		if *format == "json" {
			return writeJSON(stdout, rows)
		}
		return writeStatusTable(stdout, rows)
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
// the table its token records.
func loadStatus(ctx context.Context, db *sql.DB, changelog, tokens string, staleAfter time.Duration,
	tableOf func(client, recorded string) string) ([]clientStatus, error) {
	rows, err := db.QueryContext(ctx, `SELECT client_name, resume_token::text, last_updated, now() FROM `+
		tokens+` ORDER BY client_name`)
	if err != nil {
		return nil, fmt.Errorf("read saved positions: %w", err)
	}
	var (
		out []clientStatus
		now time.Time
	)
	for rows.Next() {
		var (
			s     clientStatus
			saved sql.NullTime
		)
		if err := rows.Scan(&s.Client, &s.Token, &saved, &now); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read saved positions: %w", err)
		}
		if saved.Valid {
			s.SavedAt = &saved.Time
			s.Stale = now.Sub(saved.Time) >= staleAfter
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read saved positions: %w", err)
	}
	backlogSQL := `SELECT count(*), COALESCE(extract(epoch FROM now() - min(changed_at))::float8, 0) FROM ` + changelog +
		` WHERE (changed_at, id) > ($1, $2)`
	for i := range out {
		s := &out[i]
		pos, err := resolvePosition(ctx, db, changelog, s)
		if err != nil {
			return nil, err
		}
		if s.TokenFormat == tokenInvalid {
			continue
		}
		if s.PositionTime != nil {
			age := math.Round(now.Sub(*s.PositionTime).Seconds()*1000) / 1000
			s.AgeSeconds = &age
		}
		q, args := backlogSQL, []any{pos.ChangedAt, pos.ID}
		if table := tableOf(s.Client, deref(s.Table)); table != "" {
			q, args = q+` AND table_name = $3`, append(args, table)
			s.BacklogTable = &table
		}
		var (
			n   int64
			lag float64
		)
		if err := db.QueryRowContext(ctx, q, args...).Scan(&n, &lag); err != nil {
			return nil, fmt.Errorf("count the backlog of client %s: %w", s.Client, err)
		}
		lag = math.Round(max(lag, 0)*1000) / 1000
		s.Backlog, s.LagSeconds = &n, &lag
	}
	return out, nil
}

// resolvePosition decodes s.Token, sets the token format and position fields of s, and returns
// the position a watcher loading this token would resume after.
func resolvePosition(ctx context.Context, db *sql.DB, changelog string, s *clientStatus) (pgchangestream.Position, error) {
	var t struct {
		Timestamp string      `json:"timestamp"`
		EventID   json.Number `json:"eventID"`
		Table     string      `json:"table"`
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(s.Token)))
	dec.UseNumber()
	err := dec.Decode(&t)
	if t.Table != "" {
		s.Table = &t.Table
	}
	var id int64
	if err == nil {
		id, err = parseEventID(t.EventID)
	}
	if err != nil {
		s.TokenFormat, s.Error = tokenInvalid, err.Error()
		return pgchangestream.Position{}, nil
	}
	s.PositionID = &id
	if t.Timestamp != "" {
		ts, err := time.Parse(time.RFC3339Nano, t.Timestamp)
		if err != nil {
			s.PositionID, s.TokenFormat, s.Error = nil, tokenInvalid, "timestamp: "+err.Error()
			return pgchangestream.Position{}, nil
		}
		ts = ts.Truncate(time.Microsecond).UTC()
		s.TokenFormat, s.PositionTime = tokenWithTime, &ts
		return pgchangestream.Position{ChangedAt: ts, ID: id}, nil
	}
	var ts time.Time
	err = db.QueryRowContext(ctx, `SELECT changed_at FROM `+changelog+` WHERE id = $1`, id).Scan(&ts)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		// Like the watcher: before every row, so that everything is replayed.
		s.TokenFormat = tokenRowGone
		return pgchangestream.Position{ID: id}, nil
	case err != nil:
		return pgchangestream.Position{}, fmt.Errorf("look up the row of client %s's token: %w", s.Client, err)
	}
	ts = ts.UTC()
	s.TokenFormat, s.PositionTime = tokenIDOnly, &ts
	return pgchangestream.Position{ChangedAt: ts, ID: id}, nil
}

// parseEventID parses a token's eventID: an integer, possibly written as a float.
func parseEventID(n json.Number) (int64, error) {
	if n == "" {
		return 0, errors.New("no eventID")
	}
	if id, err := strconv.ParseInt(n.String(), 10, 64); err == nil {
		return id, nil
	}
	f, err := n.Float64()
	if err != nil || f != float64(int64(f)) {
		return 0, fmt.Errorf("eventID %s is not an integer", n)
	}
	return int64(f), nil
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
