package pgchangestream

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Every number jsonb accepts reaches the consumer: numbers a float64 cannot hold are a
// json.Number of the text PostgreSQL writes, in fullDocument, updatedFields,
// fullDocumentBeforeChange and typed reads, with and without RawDocuments.
func TestLiveDocumentsKeepNumbersFloat64CannotHold(t *testing.T) {
	for _, mode := range []Mode{ModePolling, ModeHybrid} {
		for _, rawDocuments := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/raw=%v", mode, rawDocuments), func(t *testing.T) {
				e := newLive(t)
				cfg := e.config(mode)
				cfg.RawDocuments = rawDocuments
				cfg.StartFromBeginning = true
				w := e.start(cfg)
				var record string
				require.NoError(t, e.db.QueryRow(`INSERT INTO items (n, doc) VALUES (1,
					'{"huge": 1e400, "label": "keep me", "long": 123456789012345678901234567890, "tiny": 1e-400, "max": 9007199254740993}')
					RETURNING id::text`).Scan(&record))
				_, err := e.db.Exec(`UPDATE items SET doc = jsonb_set(doc, '{huge}', '-1e400') WHERE id::text = $1`, record)
				require.NoError(t, err)
				_, err = e.db.Exec(`DELETE FROM items WHERE id::text = $1`, record)
				require.NoError(t, err)
				text := func(expr string) json.Number {
					var s string
					require.NoError(t, e.db.QueryRow(`SELECT (`+expr+`)::jsonb::text`).Scan(&s))
					return json.Number(s)
				}
				huge, negHuge, long, tiny := text(`'1e400'`), text(`'-1e400'`), text(`'123456789012345678901234567890'`), text(`'1e-400'`)
				wantDoc := map[string]any{"huge": huge, "label": "keep me", "long": long, "tiny": tiny, "max": json.Number("9007199254740993")}

				type typed struct {
					Doc struct {
						Huge  json.Number `json:"huge"`
						Label string      `json:"label"`
						Long  json.Number `json:"long"`
						Max   uint64      `json:"max"`
					} `json:"doc"`
				}
				ins := receiveEvent(t, w)
				require.Equal(t, wantDoc, fullDocument(ins)["doc"])
				doc, err := Document[typed](ins)
				require.NoError(t, err)
				require.Equal(t, huge, doc.Doc.Huge)
				require.Equal(t, "keep me", doc.Doc.Label)
				require.Equal(t, long, doc.Doc.Long)
				require.Equal(t, uint64(9007199254740993), doc.Doc.Max)

				upd := receiveEvent(t, w)
				wantDoc["huge"] = negHuge
				require.Equal(t, wantDoc, fullDocument(upd)["doc"])
				require.Equal(t, map[string]any{"doc.huge": negHuge}, upd.UpdatedFields())

				del := receiveEvent(t, w)
				before, _ := del.Event["fullDocumentBeforeChange"].(map[string]any)
				require.Equal(t, wantDoc, before["doc"])
				require.NoError(t, w.Err())
				require.Nil(t, w.Stats().LastError)
			})
		}
	}
}

// receiveEvent takes the next delivery, failing the test if none arrives within liveWait.
func receiveEvent(t *testing.T, w *Watcher) EventWithToken {
	t.Helper()
	select {
	case ev, ok := <-w.Events():
		require.True(t, ok, "Events closed (Err: %v)", w.Err())
		return ev
	case <-time.After(liveWait):
		t.Fatalf("no delivery in %v; stats %+v", liveWait, w.Stats())
	}
	return EventWithToken{}
}

// fullDocument returns the fullDocument of ev, decoded from the text when the watcher did not
// decode it (RawDocuments).
func fullDocument(ev EventWithToken) map[string]any {
	doc, _ := ev.documentEvent()["fullDocument"].(map[string]any)
	return doc
}
