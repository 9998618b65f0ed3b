package pgchangestream

import "github.com/jackc/pgx/v5/pgconn"

// onNotification hands payload to the watcher's LISTEN service, as its connection would; a
// watcher that does not listen gets a service that is never run.
func (w *Watcher) onNotification(payload string) {
	l := w.listen
	if l == nil {
		l = w.newListener(&pgconn.Config{RuntimeParams: map[string]string{}})
	}
	l.Notify(payload)
}
