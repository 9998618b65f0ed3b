package changelog

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
)

// captureCheckSQL reads, for every capture trigger of the table named $4 (the trigger $5, in any
// schema), the table, the number of its arguments, the state of its function, whether the
// library's schema was installed beside the changelog $1 (its unit function $2 or its
// dead-letter table $3 exists: before that, the existing schema's plain function is expected)
// and whether the changelog has the unit column (where schema.Capture gives health_events its
// default key).
const captureCheckSQL = SchemaCTE + `
SELECT format('%I.%I', tn.nspname, tc.relname), t.tgnargs, ` + FunctionColumns + `,
	to_regprocedure($2) IS NOT NULL OR to_regclass($3) IS NOT NULL,
	EXISTS (SELECT FROM pg_catalog.pg_attribute a WHERE a.attrelid = cl.oid AND a.attname = '` + UnitColumn + `'
		AND NOT a.attisdropped)
FROM cl, pg_catalog.pg_trigger t
JOIN pg_catalog.pg_class tc ON tc.oid = t.tgrelid
JOIN pg_catalog.pg_namespace tn ON tn.oid = tc.relnamespace
JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
WHERE tc.relname = $4 AND t.tgname = $5 AND NOT t.tgisinternal
ORDER BY 1`

// CaptureProblems checks the capture triggers of table (a bare name) on the changelog and
// their trigger function. It returns what differs from the schema the library installs, each
// with the fix, or nil. A changelog beside which schema.Install never ran is not checked: the
// existing schema's plain function is what it has.
func CaptureProblems(ctx context.Context, db *sql.DB, log, table string) ([]string, error) {
	rows, err := db.QueryContext(ctx, captureCheckSQL, Quote(log),
		Quote(UnitFunction(log))+"(text)", Quote(ParkedTable(log)),
		table, TriggerName(table))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var problems []string
	for rows.Next() {
		var (
			target             string
			nargs              int
			fn                 FunctionState
			installed, hasUnit bool
		)
		if err := rows.Scan(append(append([]any{&target, &nargs}, fn.ScanDest()...), &installed, &hasUnit)...); err != nil {
			return nil, err
		}
		if !installed {
			continue
		}
		if p := fn.Problem(); p != "" {
			if p += "; other DDL replaced it (" + ReplacedBy + ")"; !slices.Contains(problems, p) {
				problems = append(problems, p)
			}
		}
		if nargs == 0 && table == HealthEventsTable && hasUnit {
			problems = append(problems, fmt.Sprintf("trigger %s on %s has no arguments, so its rows lose their key %s "+
				"(other DDL dropped and created it again, such as a service's DROP TRIGGER and CREATE TRIGGER)",
				TriggerName(table), target, DefaultHealthEventsKey))
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return problems, nil
}
