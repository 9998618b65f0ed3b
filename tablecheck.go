package pgchangestream

import (
	"context"
	"strings"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
)

// tableCheckQuery asks whether the changelog has a row of table $1, or a table named $1 has a
// trigger. The first part is one probe of the (table_name, changed_at, id) index.
func tableCheckQuery(log string) string {
	return `SELECT EXISTS (SELECT 1 FROM ` + changelog.Quote(log) + ` WHERE table_name = $1)
	OR EXISTS (SELECT 1 FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
		WHERE c.relname = $1 AND NOT t.tgisinternal)`
}

// checkTableName warns, once at start-up, when [Config.TableName] looks like it will never
// match: no changelog row has it and no table of that name has a trigger. The changelog's
// table_name is the trigger's TG_TABLE_NAME, the bare table name, so a schema prefix is the
// usual cause, and the warning says so. A failing check only logs at debug level: it must not
// hold the watcher up.
func (w *Watcher) checkTableName(ctx context.Context) {
	name := w.cfg.TableName
	var found bool
	if err := w.cfg.DB.QueryRowContext(ctx, tableCheckQuery(w.cfg.ChangelogTable), name).Scan(&found); err != nil {
		w.log.Debug("cannot check Config.TableName against the changelog", "error", err)
		return
	}
	if found {
		return
	}
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		w.log.Warn("Config.TableName has a schema prefix, but the changelog records bare table names: no event will match",
			"use", name[i+1:])
		return
	}
	w.log.Warn("no changelog row and no table with a trigger has Config.TableName: check the name, and that schema.Capture ran for the table")
}
