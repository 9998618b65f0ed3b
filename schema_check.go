package pgchangestream

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/pgchangestream/pgchangestream/internal/backoff"
	"github.com/pgchangestream/pgchangestream/internal/changelog"
)

// Checks that the trigger function and the capture triggers are still what schema.Install and
// schema.Capture made them. Other DDL can undo both without an error: a service that runs
// CREATE OR REPLACE FUNCTION log_table_changes() with a plain body (the upstream services do,
// at every start in their runtime-DDL generation and in SQL migration 00002 in the newer one)
// drops SECURITY DEFINER and the pinned search_path, and writers whose changelog grants were
// revoked then fail every insert into a captured table; dropping a capture trigger and creating
// it again without arguments (the same start-up does) drops its key and no_notify.

// Schema checks: the first at Start, then one every schemaCheckInterval, each bounded by
// schemaCheckTimeout. A problem is in Health within schemaCheckInterval+schemaCheckTimeout.
const (
	schemaCheckInterval = 30 * time.Second
	schemaCheckTimeout  = 10 * time.Second
)

// The log messages of the schema checks.
const (
	logSchemaChanged  = "the changelog's trigger function or capture trigger was changed by other DDL"
	logSchemaRestored = "the trigger function and capture trigger are the library's again"
)

// schemaCheckLoop checks the capture triggers of the watcher's table and their function at
// Start, then every w.schemaEvery, until ctx ends: a problem is a Health failure (opSchema)
// until a check finds it gone, and is logged when it appears and when it clears, not at every
// check. A check that cannot run changes nothing (reads report a lost connection). Its own
// goroutine.
func (w *Watcher) schemaCheckLoop(ctx context.Context) {
	defer w.wg.Done()
	var last string // the problems last logged; this goroutine's
	for {
		qctx, cancel := context.WithTimeout(ctx, schemaCheckTimeout)
		problems, err := changelog.CaptureProblems(qctx, w.cfg.DB, w.cfg.ChangelogTable, w.cfg.TableName)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			w.log.Debug("cannot check the trigger function and capture trigger", "error", err)
		case len(problems) > 0:
			msg := strings.Join(problems, "; ")
			w.health.fail(opSchema, fmt.Errorf("%s: %s: %s", opSchema, msg, changelog.RepairHint))
			if msg != last {
				w.log.Error(logSchemaChanged, "problem", msg, "fix", changelog.RepairHint)
			}
			last = msg
		default:
			w.health.ok(opSchema)
			if last != "" {
				w.log.Info(logSchemaRestored)
			}
			last = ""
		}
		if w.schemaChecked != nil {
			w.schemaChecked()
		}
		if !backoff.Sleep(ctx, w.schemaEvery) {
			return
		}
	}
}

// checkTableName warns, once at start-up, when [Config.TableName] looks like it will never
// match: no changelog row has it and no table of that name has a trigger. The changelog's
// table_name is the trigger's TG_TABLE_NAME, the bare table name, so a schema prefix is the
// usual cause, and the warning says so. A failing check only logs at debug level: it must not
// hold the watcher up.
func (r *reader) checkTableName(ctx context.Context) {
	name := r.cfg.TableName
	var found bool
	if err := r.cfg.DB.QueryRowContext(ctx, changelog.TableCheckSQL(r.cfg.ChangelogTable), name).Scan(&found); err != nil {
		r.log.Debug("cannot check Config.TableName against the changelog", "error", err)
		return
	}
	if found {
		return
	}
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		r.log.Warn("Config.TableName has a schema prefix, but the changelog records bare table names: no event will match",
			"use", name[i+1:])
		return
	}
	r.log.Warn("no changelog row and no table with a trigger has Config.TableName: check the name, and that schema.Capture ran for the table")
}
