package pgchangestream

import (
	"context"
	"log/slog"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/document"
	"github.com/pgchangestream/pgchangestream/internal/position"
	"github.com/pgchangestream/pgchangestream/internal/procrun"
	"github.com/pgchangestream/pgchangestream/internal/testhooks"
)

// init hands the test kit (package pgchangestreamtest) the statements, builders, position
// functions and Process runtime it shares with the watcher.
func init() {
	testhooks.Register(testhooks.Hooks[Config, Position]{
		Defaults:     Config.withDefaults,
		Statements:   testStatements,
		MakePosition: position.Make,
		Predecessor:  Position.Predecessor,
		DecodeToken:  position.DecodeToken,
		ParseToken:   position.ParseToken,
		BuildEvent: func(r testhooks.Row, table, documentField string) (map[string]any, error) {
			ev, _, err := document.Build(&changelogRow{ID: r.ID, RecordID: r.RecordID, Operation: r.Operation,
				OldValues: r.OldValues, NewValues: r.NewValues, ChangedAt: r.ChangedAt}, table, document.Options{Field: documentField})
			return ev, err
		},
	})
	testhooks.RegisterProcess(testhooks.Process[ProcessOptions, Handler, EventWithToken, ParkedEvent, ProcessStats]{
		Check: checkProcess,
		NewEngine: func(log *slog.Logger) testhooks.Engine[ProcessOptions, Handler, EventWithToken, ProcessStats] {
			return kitEngine{w: &Watcher{log: log}}
		},
		DeadLetters: func(client string, s testhooks.ParkedStore[ParkedEvent]) procrun.Store[EventWithToken] {
			return deadLetters{client: client, s: s}
		},
	})
}

// kitEngine is Process's runtime for the test kit: a watcher with nothing but its logger and
// its Process counters, which is all runEngine uses when it defers no event (the kit has no
// changelog to read a deferred event again from).
type kitEngine struct{ w *Watcher }

func (e kitEngine) Run(ctx context.Context, src <-chan EventWithToken, o ProcessOptions, handle Handler,
	store procrun.Store[EventWithToken], advance func(EventWithToken)) error {
	return e.w.runEngine(ctx, src, o, e.w.handlerStep(handle).run, store, advance, nil, nil)
}

func (e kitEngine) Stats() ProcessStats { return e.w.processStats() }

// testStatements returns the statements of cfg for the test kit.
func testStatements(cfg Config) testhooks.Statements {
	cfg = cfg.withDefaults()
	q := statements(cfg)
	return testhooks.Statements{
		Detect: q.Detect, DetectArg: changelog.Quote(cfg.ChangelogTable),
		DetectIncArg: changelog.Quote(changelog.IncarnationTable(cfg.ChangelogTable)), DeltaStart: q.DeltaStart,
		LoadToken: q.LoadToken, SaveToken: q.SaveToken, AckTx: q.AckTx[changelog.AckIndex(false, "")], Newest: q.Newest,
		TableCheck: changelog.TableCheckSQL(cfg.ChangelogTable), Read: q.Read, Snapshot: q.Snapshot,
		DeltaRange: q.DeltaRange, Unprocessed: q.Unprocessed,
	}
}
