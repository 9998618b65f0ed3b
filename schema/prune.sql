{{- /*
The retention function, for deployments that schedule retention in the database (pg_cron).
schema.Install appends it to the install script. It deletes what Prune deletes: the changelog rows
older than older_than that some saved token counts for (a token counts for the table it records,
one that records none for every table) and that every such token, but those of ignore_clients,
certifies, by the predicate Prune uses (a shared client's tokens are those of its ranges, and its
token-table row no longer counts once they exist): .Certified is rendered from changelog.CertifiedByToken (internal/changelog) over
the columns of the decoded tokens. It decodes the tokens as the watcher does (token.go) and
refuses (raises) on one it cannot read, as Prune does; a token whose row is gone (id only) holds
every row back, so it deletes nothing. The tokens are read once, before the first batch; each
batch is one DELETE of at most batch_size rows, in the caller's transaction. It returns the
number of rows deleted. Its variables are named v_* so that none is mistaken for a column. It
runs with the caller's rights, and refuses, as Prune does, a caller that a restrictive policy
(RestrictTokens) keeps from seeing every token: .Restricted is rendered from changelog.RestrictedTokens
(internal/changelog), .Refusal from its message.
*/ -}}
{{define "prune_function" -}}
CREATE OR REPLACE FUNCTION {{.Function}}(
    older_than     interval DEFAULT interval '0',
    batch_size     integer DEFAULT {{.DefaultBatch}},
    only_table     text DEFAULT NULL,
    ignore_clients text[] DEFAULT '{}'
) RETURNS bigint
LANGUAGE plpgsql AS $prune$
DECLARE
    v_tok     record;
    v_t       jsonb;
    v_bad     text;
    v_table   text;
    v_form    text;
    v_ts      timestamptz;
    v_id      bigint;
    v_base    text;
    v_end     text;
    v_after   text;
    v_xid     text;
    v_forms   text[] := '{}';
    v_tss     timestamptz[] := '{}';
    v_ids     bigint[] := '{}';
    v_bases   text[] := '{}';
    v_ends    text[] := '{}';
    v_tables  text[] := '{}';
    v_deleted bigint := 0;
    v_n       bigint;
BEGIN
    IF {{.Restricted}} THEN
        RAISE EXCEPTION {{.Refusal}}, {{.TokenTableLiteral}} USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF older_than IS NULL OR older_than < interval '0' THEN
        RAISE EXCEPTION 'older_than must be 0 or more, got %', older_than;
    END IF;
    IF batch_size IS NULL OR batch_size < 1 THEN
        RAISE EXCEPTION 'batch_size must be at least 1, got %', batch_size;
    END IF;
    FOR v_tok IN SELECT k.client_name, k.resume_token FROM {{.TokenTable}} k
                 WHERE NOT k.client_name = ANY (coalesce(ignore_clients, '{}'))
                     AND NOT EXISTS (SELECT FROM {{.Ranges}} r WHERE r.client_name = k.client_name)
                 UNION ALL
                 SELECT r.client_name || ' range ' || r.range_no, r.resume_token FROM {{.Ranges}} r
                 WHERE NOT r.client_name = ANY (coalesce(ignore_clients, '{}'))
                 ORDER BY 1 LOOP
        v_t := v_tok.resume_token;
        IF jsonb_typeof(v_t) IS DISTINCT FROM 'object' THEN
            RAISE EXCEPTION 'client %: saved token % is not a JSON object', v_tok.client_name, v_t;
        END IF;
        -- The field types the watcher's decoder accepts: text fields are strings, number fields
        -- numbers or strings holding one (an integer here), null is absent; a key that names a
        -- field in other case would be read by that decoder and not here.
        SELECT string_agg(e.k, ', ') INTO v_bad FROM jsonb_each(v_t) AS e(k, v)
        WHERE (e.k IN ('timestamp', 'snapshot', 'deltaEnd', 'deltaXid', 'switchover', 'table')
                AND jsonb_typeof(e.v) NOT IN ('string', 'null'))
            OR (e.k IN ('eventID', 'deltaAfterID', 'deltaID') AND jsonb_typeof(e.v) <> 'null'
                AND NOT (jsonb_typeof(e.v) IN ('number', 'string')
                    AND (e.v #>> '{}') ~ '^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?$'
                    AND (e.v #>> '{}')::numeric = trunc((e.v #>> '{}')::numeric)
                    AND abs((e.v #>> '{}')::numeric) < 9223372036854775808))
            OR (lower(e.k) IN ('timestamp', 'eventid', 'snapshot', 'deltaend', 'deltaafterid', 'deltaxid',
                    'deltaid', 'switchover', 'table')
                AND e.k NOT IN ('timestamp', 'eventID', 'snapshot', 'deltaEnd', 'deltaAfterID', 'deltaXid',
                    'deltaID', 'switchover', 'table'));
        IF v_bad IS NOT NULL THEN
            RAISE EXCEPTION 'client %: saved token %: cannot read %', v_tok.client_name, v_t, v_bad;
        END IF;
        v_table := nullif(v_t->>'table', '');
        IF only_table IS NOT NULL AND v_table IS NOT NULL AND v_table <> only_table THEN
            CONTINUE; -- it certifies nothing about the rows in reach
        END IF;
        v_id := (v_t->>'eventID')::numeric::bigint;
        IF v_id IS NULL THEN
            RAISE EXCEPTION 'client %: saved token % has no eventID', v_tok.client_name, v_t;
        END IF;
        v_form := '{{.Legacy}}';
        v_ts := NULL;
        v_base := nullif(v_t->>'switchover', '');
        v_end := nullif(v_t->>'deltaEnd', '');
        v_after := v_t->>'deltaAfterID';
        v_xid := nullif(v_t->>'deltaXid', '');
        IF nullif(v_t->>'timestamp', '') IS NULL THEN
            IF v_base IS NOT NULL OR nullif(v_t->>'snapshot', '') IS NOT NULL THEN
                RAISE EXCEPTION 'client %: saved token % has a snapshot but no timestamp', v_tok.client_name, v_t;
            END IF;
            SELECT c.changed_at INTO v_ts FROM {{.Changelog}} c WHERE c.id = v_id;
            IF NOT FOUND THEN
                RETURN 0; -- its watcher replays from the beginning: every row is held back
            ELSIF v_ts IS NULL THEN
                RAISE EXCEPTION 'client %: row % of its id-only token has no changed_at', v_tok.client_name, v_id;
            END IF;
        ELSE
            IF (v_t->>'timestamp') !~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})$' THEN
                RAISE EXCEPTION 'client %: saved token %: timestamp is not RFC 3339', v_tok.client_name, v_t;
            END IF;
            -- Positions compare at microsecond precision: truncate, as the watcher does.
            v_ts := regexp_replace(v_t->>'timestamp', '(\.[0-9]{6})[0-9]+', '\1')::timestamptz;
            IF v_base IS NOT NULL THEN
                IF nullif(v_t->>'snapshot', '') IS NOT NULL OR v_end IS NOT NULL THEN
                    RAISE EXCEPTION 'client %: saved token %: switchover goes with no other snapshot', v_tok.client_name, v_t;
                END IF;
                v_form := '{{.Switchover}}';
                v_end := NULL;
            ELSE
                v_base := nullif(v_t->>'snapshot', '');
                IF v_base IS NULL THEN
                    IF v_end IS NOT NULL OR v_after IS NOT NULL OR v_xid IS NOT NULL OR v_t->>'deltaID' IS NOT NULL THEN
                        RAISE EXCEPTION 'client %: saved token %: deltaEnd, deltaAfterID, deltaXid and deltaID need a snapshot',
                            v_tok.client_name, v_t;
                    END IF;
                ELSIF v_end IS NULL THEN
                    IF v_after IS NOT NULL OR v_xid IS NOT NULL OR v_t->>'deltaID' IS NOT NULL THEN
                        RAISE EXCEPTION 'client %: saved token %: deltaAfterID, deltaXid and deltaID need a deltaEnd',
                            v_tok.client_name, v_t;
                    END IF;
                    v_form := '{{.Snapshot}}';
                ELSE
                    IF pg_snapshot_xmax(v_end::pg_snapshot) < pg_snapshot_xmax(v_base::pg_snapshot) THEN
                        RAISE EXCEPTION 'client %: saved token %: deltaEnd is before snapshot', v_tok.client_name, v_t;
                    END IF;
                    IF v_xid IS NOT NULL OR v_t->>'deltaID' IS NOT NULL THEN
                        -- An earlier release's position in (txid, id) order: it resumes at the start
                        -- of its delta, so it certifies what its snapshot sees.
                        IF v_after IS NOT NULL OR v_xid IS NULL OR v_t->>'deltaID' IS NULL OR v_xid !~ '^[0-9]+$'
                           OR v_xid::numeric < 3 OR v_xid::numeric > 18446744073709551615
                           OR NOT pg_visible_in_snapshot(v_xid::xid8, v_end::pg_snapshot)
                           OR pg_visible_in_snapshot(v_xid::xid8, v_base::pg_snapshot) THEN
                            RAISE EXCEPTION 'client %: saved token %: deltaXid and deltaID do not name a place in the delta',
                                v_tok.client_name, v_t;
                        END IF;
                        v_form := '{{.Snapshot}}';
                        v_end := NULL;
                    ELSIF v_after IS NULL OR v_after::numeric::bigint <> v_id THEN
                        RAISE EXCEPTION 'client %: saved token %: deltaEnd needs deltaAfterID, the eventID', v_tok.client_name, v_t;
                    ELSE
                        v_form := '{{.InRows}}';
                    END IF;
                END IF;
            END IF;
            PERFORM v_base::pg_snapshot, v_end::pg_snapshot; -- raises on one that is not a snapshot
        END IF;
        v_forms := v_forms || v_form;
        v_tss := v_tss || v_ts;
        v_ids := v_ids || v_id;
        v_bases := v_bases || v_base;
        v_ends := v_ends || v_end;
        v_tables := v_tables || v_table;
    END LOOP;
    IF cardinality(v_forms) = 0 THEN
        RETURN 0; -- no token counts: every row is kept
    END IF;
    LOOP
        WITH t AS MATERIALIZED (
            SELECT * FROM unnest(v_forms, v_tss, v_ids, v_bases::pg_snapshot[], v_ends::pg_snapshot[], v_tables)
                AS u(form, ts, id, base, fin, tab)),
        doomed AS (
            SELECT c.id FROM {{.Changelog}} c
            WHERE c.changed_at < now() - older_than
                AND (only_table IS NULL OR c.table_name = only_table)
                AND EXISTS (SELECT FROM t WHERE t.tab IS NULL OR t.tab = c.table_name)
                AND NOT EXISTS (SELECT FROM t WHERE (t.tab IS NULL OR t.tab = c.table_name)
                    AND ({{.Certified}}) IS NOT TRUE)
            ORDER BY c.id LIMIT batch_size)
        DELETE FROM {{.Changelog}} d WHERE d.id IN (SELECT doomed.id FROM doomed);
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_deleted := v_deleted + v_n;
        EXIT WHEN v_n < batch_size;
    END LOOP;
    RETURN v_deleted;
END
$prune$
{{- end}}
