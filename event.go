package pgchangestream

import (
	"github.com/pgchangestream/pgchangestream/internal/document"
)

// changelogRow is one row of the changelog as read by the watcher (see [document.Row]).
type changelogRow = document.Row

// event builds the event document of a row read by the watcher and what is kept to decode its
// fullDocument from the JSON text (see [document.Decode]), and warns about a row whose value has
// no object under [Config.DocumentField]. With [Config.RawDocuments] the documents are not
// decoded when the row's text can be vouched for.
func (w *Watcher) event(row *changelogRow) (Event, *document.Raw, error) {
	ev, raw, unwrapMissed, err := document.Decode(row, w.cfg.TableName, w.cfg.documents())
	if unwrapMissed {
		w.log.Warn("changelog row has no object under Config.DocumentField; its whole value is the document",
			"id", row.ID, "document_field", w.cfg.DocumentField)
	}
	return ev, raw, err
}

// legacyDocumentField is the [Config.DocumentField] of [NewPostgreSQLChangeStreamWatcher]: the
// replaced watcher published the "document" object of health_events rows, and whole rows of
// every other table.
func legacyDocumentField(table string) string {
	if table == "health_events" {
		return "document"
	}
	return ""
}
