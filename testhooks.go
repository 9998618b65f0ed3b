package pgchangestream

import "github.com/pgchangestream/pgchangestream/internal/testhooks"

// init hands the test kit (package pgchangestreamtest) the statements, builders and position
// functions it shares with the watcher.
func init() {
	testhooks.Register(testhooks.Hooks[Config, Position]{
		Defaults:     Config.withDefaults,
		Statements:   testStatements,
		MakePosition: makePosition,
		Predecessor:  Position.predecessor,
		DecodeToken:  decodeToken,
		ParseToken:   parseToken,
		BuildEvent: func(r testhooks.Row, table, documentField string) (map[string]any, error) {
			ev, _, err := buildEvent(&changelogRow{ID: r.ID, RecordID: r.RecordID, Operation: r.Operation,
				OldValues: r.OldValues, NewValues: r.NewValues, ChangedAt: r.ChangedAt}, table, documentField)
			return ev, err
		},
	})
}

// testStatements returns the statements of cfg for the test kit.
func testStatements(cfg Config) testhooks.Statements {
	cfg = cfg.withDefaults()
	q := buildQueries(cfg)
	return testhooks.Statements{
		Detect: q.detect, DetectArg: quoteIdentifier(cfg.ChangelogTable),
		DetectIncArg: quoteIdentifier(incarnationTable(cfg.ChangelogTable)), DeltaStart: q.deltaStart,
		LoadToken: q.loadToken, SaveToken: q.saveToken, AckTx: q.ackTx[ackIndex(false, "")], Newest: q.newest,
		TableCheck: tableCheckQuery(cfg.ChangelogTable), Read: q.read, Snapshot: q.snapshot,
		DeltaRange: q.deltaRange, Unprocessed: q.unprocessed,
	}
}
