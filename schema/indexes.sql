{{- /*
The changelog's indexes. .Create is "CREATE INDEX" (inside the install transaction, with a new
table) or "CREATE INDEX CONCURRENTLY" (its own Exec call, on an existing table).

stream_index serves the legacy reads: table_name = $1 AND (changed_at, id) > ($2, $3) ORDER BY
changed_at, id. It must not be partial. txid_unit_index serves the reads in snapshot deltas:
one (txid, id) range of a table per scan; its last column, the row's unit (.Unit, the expression
readers use), lets a shared member's read of some units skip the other units' index tuples
before it visits the heap. It replaces the earlier (table_name, txid, id) index, which a
changelog upgraded before keeps. The other two are the existing schema's, used by the
unprocessed-event count and the legacy processed update.
*/ -}}
{{define "stream_index" -}}
{{.Create}} IF NOT EXISTS {{.Name}} ON {{.Changelog}} (table_name, changed_at, id)
{{- end}}
{{define "unprocessed_index" -}}
{{.Create}} IF NOT EXISTS {{.Name}} ON {{.Changelog}} (changed_at) WHERE processed = FALSE
{{- end}}
{{define "txid_unit_index" -}}
{{.Create}} IF NOT EXISTS {{.Name}} ON {{.Changelog}} (table_name, txid, id, ({{.Unit}}))
{{- end}}
{{define "table_record_index" -}}
{{.Create}} IF NOT EXISTS {{.Name}} ON {{.Changelog}} (table_name, record_id)
{{- end}}

{{- /*
Indexes of the changelog ($1, its quoted name) left invalid by a failed concurrent build; CREATE
INDEX ... IF NOT EXISTS would keep them. schema.Install drops ours with drop_index and builds them
again.
*/ -}}
{{define "invalid_indexes" -}}
SELECT n.nspname, c.relname
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE i.indrelid = to_regclass($1) AND NOT i.indisvalid
{{- end}}
{{define "drop_index"}}DROP INDEX CONCURRENTLY IF EXISTS {{.}}{{end}}

{{- /*
The session-level lock that serializes whole schema.Install runs. It is only ever tried, never
waited for in the server: a session blocked on a lock holds a snapshot, a concurrent index build
waits for every older snapshot, and the two deadlock.
*/ -}}
{{define "try_install_lock"}}SELECT pg_try_advisory_lock($1){{end}}
{{define "install_unlock"}}SELECT pg_advisory_unlock($1){{end}}
{{define "server_version"}}SELECT current_setting('server_version_num')::int{{end}}
