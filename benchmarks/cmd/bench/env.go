package main

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver

	"github.com/pgchangestream/pgchangestream"
	"github.com/pgchangestream/pgchangestream/internal/pgtest"
	"github.com/pgchangestream/pgchangestream/schema"
)

// Names shared by every scenario.
const (
	// templateName is the database holding the schema and the captured tables; each scenario
	// works on a copy of it (of the legacy variant's template, templateName + "_legacy", for
	// a drain on the legacy schema).
	templateName = "bench_template"
	// itemsTable is the captured table of most scenarios.
	itemsTable = "items"
	// healthTable is the captured table shaped like the store-client's: an id and a JSON
	// document of about 1 KB.
	healthTable = "health_events"
	// changelogTable and tokenTable are the library's defaults.
	changelogTable = pgchangestream.DefaultChangelogTable
	tokenTable     = pgchangestream.DefaultTokenTable
	// fillChunk is the number of rows per INSERT (and per transaction) when filling a backlog.
	fillChunk = 500
)

// upsertSQL is the token upsert the watcher runs on every save (internal/changelog/statements.go,
// default token table), copied here to measure its ceiling alone.
const upsertSQL = `INSERT INTO ` + tokenTable + ` (client_name, resume_token, last_updated) VALUES ($1, $2::jsonb, now())
	ON CONFLICT (client_name) DO UPDATE SET resume_token = EXCLUDED.resume_token, last_updated = EXCLUDED.last_updated`

// docSQL builds the JSON document of row g: about 150 bytes, one nested object and an array.
// to_jsonb(NEW) wraps it with the id and n columns, so a changelog new_values is ~200 bytes.
const docSQL = `jsonb_build_object('name', 'item-' || g, 'status', 'active', 'count', g,
	'labels', jsonb_build_object('zone', 'zone-' || (g % 8), 'tier', 'gold'),
	'tags', jsonb_build_array('alpha', 'beta', 'gamma'))`

// quietLogger discards the watchers' logs.
var quietLogger = slog.New(slog.DiscardHandler)

// env is the benchmark's one PostgreSQL server.
type env struct {
	srv *pgtest.Server
}

// variant is a state of the changelog schema that drains run on.
type variant string

const (
	// upgraded is the schema schema.Install creates: the changelog with its txid column, read
	// with snapshot-delta reads. Figures without a variant label are of this one.
	upgraded variant = "upgraded"
	// legacy is the same schema without the txid column, read with (changed_at, id) reads:
	// schema.Install followed by ALTER TABLE ... DROP COLUMN IF EXISTS txid.
	legacy variant = "legacy"
)

// variants lists every variant, in report order.
var variants = []variant{legacy, upgraded}

// template returns the name of the variant's template database.
func (v variant) template() string {
	if v == legacy {
		return templateName + "_legacy"
	}
	return templateName
}

// key returns the sample key of figure key on the variant: the key itself on the upgraded
// schema (as before variants existed), "legacy/" + key on the legacy one.
func (v variant) key(key string) string {
	if v == legacy {
		return string(v) + "/" + key
	}
	return key
}

// startEnv starts a throwaway server with durable commits and prepares a template database
// of each variant.
func startEnv(ctx context.Context) (*env, error) {
	srv, err := pgtest.Start(ctx, pgtest.Options{Fsync: true})
	if err != nil {
		return nil, err
	}
	e := &env{srv: srv}
	for _, v := range variants {
		if err := srv.CreateTemplate(ctx, v.template(), setupTemplate(v)); err != nil {
			_ = srv.Stop()
			return nil, err
		}
	}
	return e, nil
}

// setupTemplate returns the setup of the variant's template: install the schema, shape it as
// the variant says, create and capture the items and health_events tables.
func setupTemplate(v variant) func(ctx context.Context, db *sql.DB) error {
	return func(ctx context.Context, db *sql.DB) error {
		if _, err := schema.Install(ctx, db, schema.Options{}); err != nil {
			return err
		}
		stmts := []string{
			`CREATE TABLE IF NOT EXISTS ` + itemsTable + ` (id bigserial PRIMARY KEY, n bigint NOT NULL, doc jsonb NOT NULL)`,
			`CREATE TABLE IF NOT EXISTS ` + healthTable + ` (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), document jsonb NOT NULL)`,
		}
		if v == legacy {
			stmts = append(stmts, `ALTER TABLE `+changelogTable+` DROP COLUMN IF EXISTS txid`)
		}
		for _, stmt := range stmts {
			if _, err := db.ExecContext(ctx, stmt); err != nil {
				return err
			}
		}
		for _, table := range []string{itemsTable, healthTable} {
			if _, err := schema.Capture(ctx, db, table, schema.Options{}); err != nil {
				return err
			}
		}
		return nil
	}
}

// stop stops the server.
func (e *env) stop() error { return e.srv.Stop() }

// database is one scenario's copy of the template.
type database struct {
	*sql.DB
	dsn     string
	name    string
	variant variant
	env     *env
}

// newDatabase creates a fresh copy of the variant's template and opens it.
func (e *env) newDatabase(ctx context.Context, v variant) (*database, error) {
	dsn, err := e.srv.CreateDatabase(ctx, v.template())
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", dsn, err)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32)
	return &database{DB: db, dsn: dsn, name: strings.TrimPrefix(u.Path, "/"), variant: v, env: e}, nil
}

// drop closes the database and drops it, so large scenarios do not fill the disk.
func (d *database) drop(ctx context.Context) {
	_ = d.Close()
	_ = d.env.srv.DropDatabase(ctx, d.name)
}

// fillItems inserts n rows into the captured table through the trigger, fillChunk rows per
// statement, then analyzes the changelog, as autovacuum does within a minute of such a burst
// (see analyzeChangelog).
func (d *database) fillItems(ctx context.Context, n int) error {
	if err := d.fillItemsUnanalyzed(ctx, n); err != nil {
		return err
	}
	return d.analyzeChangelog(ctx)
}

// fillItemsBulk inserts n rows into the captured table in one statement, so one transaction
// writes them all with the same changed_at, then analyzes the changelog.
func (d *database) fillItemsBulk(ctx context.Context, n int) error {
	if _, err := d.ExecContext(ctx, `INSERT INTO `+itemsTable+` (n, doc)
		SELECT g, `+docSQL+` FROM generate_series(1, $1::bigint) g`, n); err != nil {
		return fmt.Errorf("fill items in one transaction: %w", err)
	}
	return d.analyzeChangelog(ctx)
}

// fillItemsUnanalyzed is fillItems without the ANALYZE.
func (d *database) fillItemsUnanalyzed(ctx context.Context, n int) error {
	for from := 1; from <= n; from += fillChunk {
		to := min(from+fillChunk-1, n)
		if _, err := d.ExecContext(ctx, `INSERT INTO `+itemsTable+` (n, doc)
			SELECT g, `+docSQL+` FROM generate_series($1::bigint, $2::bigint) g`, from, to); err != nil {
			return fmt.Errorf("fill items: %w", err)
		}
	}
	return nil
}

// analyzeChangelog gathers the changelog's statistics. Without any (a table never analyzed),
// PostgreSQL estimates a handful of rows for table_name = $1 and reads a batch with a bitmap
// scan that fetches and sorts every remaining row of the table, so a backlog drains in
// quadratic time until autovacuum's first ANALYZE; the drain_batched_unanalyzed figure
// measures that case.
func (d *database) analyzeChangelog(ctx context.Context) error {
	if _, err := d.ExecContext(ctx, `ANALYZE `+changelogTable); err != nil {
		return fmt.Errorf("analyze changelog: %w", err)
	}
	return nil
}

// fillChangelog inserts n changelog rows of the items table directly (no trigger), in one
// statement, with increasing changed_at values that end age before now. processed sets the
// legacy flag of every row.
func (d *database) fillChangelog(ctx context.Context, n int, age time.Duration, processed bool) error {
	_, err := d.ExecContext(ctx, `INSERT INTO `+changelogTable+`
		(table_name, record_id, operation, new_values, changed_at, processed)
		SELECT $1, g::text, 'INSERT', jsonb_build_object('id', g, 'n', g, 'doc', `+docSQL+`),
			now() - $3::interval + g * interval '1 microsecond', $4
		FROM generate_series(1, $2::bigint) g`,
		itemsTable, n, fmt.Sprintf("%d microseconds", age.Microseconds()+int64(n)), processed)
	if err != nil {
		return fmt.Errorf("fill changelog: %w", err)
	}
	if _, err := d.ExecContext(ctx, `VACUUM ANALYZE `+changelogTable); err != nil {
		return fmt.Errorf("vacuum changelog: %w", err)
	}
	return nil
}

// watcherConfig is the configuration every drain starts from: polling (no LISTEN connection;
// with a backlog every read is a full batch, so the mode does not matter), a client that
// resumes from its saved token (see saveStart) or, without one, starts after the newest row,
// logs discarded.
func (d *database) watcherConfig(client string) pgchangestream.Config {
	return pgchangestream.Config{
		DB:         d.DB,
		ClientName: client,
		TableName:  itemsTable,
		Mode:       pgchangestream.ModePolling,
		Logger:     quietLogger,
	}
}
