{{- /*
Tables and trigger function. InstallSchema sends this as one Exec call, so its commands run as
one implicit transaction. The advisory lock serializes concurrent runs: CREATE ... IF NOT EXISTS
and CREATE OR REPLACE FUNCTION can still race on the catalog.

A missing changelog is created together with its indexes (cheap on an empty table). An existing
changelog, possibly the existing schema's with a UUID record_id, keeps its rows and columns; on
PostgreSQL 13 and later it gains the txid column; the indexes it lacks are built concurrently by
the statements that follow this one. (A plain CREATE INDEX IF NOT EXISTS would take a lock that
blocks writers before it finds that the index exists.)
*/ -}}
SELECT pg_advisory_xact_lock({{.LockKey}});

DO $install$
DECLARE
    changelog regclass := to_regclass({{.ChangelogLiteral}});
    created   boolean := changelog IS NULL;
    skip_free boolean := current_setting('server_version_num')::int >= 130000;
    timeout   text := current_setting('lock_timeout');
BEGIN
    IF created THEN
        CREATE TABLE {{.Changelog}} (
            id         BIGSERIAL PRIMARY KEY,
            table_name VARCHAR(100) NOT NULL,
            record_id  TEXT NOT NULL,
            operation  VARCHAR(20) NOT NULL,
            old_values JSONB,
            new_values JSONB,
            changed_at TIMESTAMPTZ DEFAULT NOW(),
            processed  BOOLEAN DEFAULT FALSE
        );
        changelog := to_regclass({{.ChangelogLiteral}});
{{- range .Indexes}}
        {{.}};
{{- end}}
    END IF;
    IF skip_free THEN
        -- The writing transaction's id, for reads in snapshot deltas. It is added without a
        -- default, then given one, so existing rows stay NULL and the table is not rewritten:
        -- two catalog changes under a short ACCESS EXCLUSIVE lock, which waits at most
        -- lock_timeout for transactions using the table (InstallSchema then tries again).
        PERFORM set_config('lock_timeout', '{{.LockTimeout}}', true);
        IF NOT EXISTS (SELECT FROM pg_attribute
                       WHERE attrelid = changelog AND attname = '{{.TxidColumn}}' AND NOT attisdropped) THEN
            ALTER TABLE {{.Changelog}} ADD COLUMN {{.TxidColumn}} xid8;
        END IF;
        IF NOT EXISTS (SELECT FROM pg_attribute a JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                       WHERE a.attrelid = changelog AND a.attname = '{{.TxidColumn}}' AND NOT a.attisdropped
                       AND pg_get_expr(d.adbin, d.adrelid) = 'pg_current_xact_id()') THEN
            ALTER TABLE {{.Changelog}} ALTER COLUMN {{.TxidColumn}} SET DEFAULT pg_current_xact_id();
        END IF;
        PERFORM set_config('lock_timeout', timeout, true);
        -- One row, which crash recovery empties (the table is unlogged) and a promoted standby or
        -- a restored backup does not have: watchers compare its value with the one they saw, to
        -- notice that the transaction counter may have gone back below ids they saw finish.
        -- Any watcher role reads it and inserts it again after a crash.
        CREATE UNLOGGED TABLE IF NOT EXISTS {{.Incarnation}} (
            one         boolean PRIMARY KEY DEFAULT TRUE CHECK (one),
            incarnation uuid NOT NULL DEFAULT gen_random_uuid()
        );
        GRANT SELECT, INSERT ON {{.Incarnation}} TO PUBLIC;
{{- range .TxidIndexes}}
        IF created THEN
            {{.}};
        END IF;
{{- end}}
    END IF;
END
$install$;

CREATE TABLE IF NOT EXISTS {{.TokenTable}} (
    client_name  VARCHAR(255) PRIMARY KEY,
    resume_token JSONB NOT NULL,
    last_updated TIMESTAMPTZ DEFAULT NOW()
);

{{/*
The dead-letter table of Process (ParkOnFailure, BlockOnFailure): events whose handler kept
failing, per client, in the order they were parked. The index serves a client's listing, a key's
events in order and the released ones.
*/ -}}
CREATE TABLE IF NOT EXISTS {{.Parked}} (
    id              BIGSERIAL PRIMARY KEY,
    client_name     VARCHAR(255) NOT NULL,
    event_key       TEXT NOT NULL,
    table_name      VARCHAR(100) NOT NULL,
    changelog_id    BIGINT NOT NULL,
    event           JSONB NOT NULL,
    error           TEXT NOT NULL,
    attempts        INTEGER NOT NULL,
    blocking        BOOLEAN NOT NULL,
    retry_requested BOOLEAN NOT NULL DEFAULT FALSE,
    parked_at       TIMESTAMPTZ NOT NULL DEFAULT NOW()
);
CREATE INDEX IF NOT EXISTS {{.ParkedIndex}} ON {{.Parked}} (client_name, event_key, id);

{{/*
The acknowledgement rows of transactional handlers (Watcher.ProcessTx): one per event a
client's handler committed, written in the handler's transaction. The key makes a second
transaction for the same event fail to claim it; the rows a saved token certifies are deleted.
*/ -}}
CREATE TABLE IF NOT EXISTS {{.Acks}} (
    client_name  VARCHAR(255) NOT NULL,
    changelog_id BIGINT NOT NULL,
    acked_at     TIMESTAMPTZ NOT NULL DEFAULT NOW(),
    PRIMARY KEY (client_name, changelog_id)
);

{{/*
The owner epoch fences the saves of exclusive watchers. A nullable column without a default is
a catalog change only (no rewrite); its ACCESS EXCLUSIVE lock waits at most lock_timeout for the
saves in flight (InstallSchema then tries again). Old watchers leave it alone.
*/ -}}
DO $tokens$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass({{.TokenTableLiteral}})
                   AND attname = '{{.EpochColumn}}' AND NOT attisdropped) THEN
        PERFORM set_config('lock_timeout', '{{.LockTimeout}}', true);
        ALTER TABLE {{.TokenTable}} ADD COLUMN IF NOT EXISTS {{.EpochColumn}} BIGINT;
    END IF;
END
$tokens$;

{{/*
record_id takes NEW.id / OLD.id without a cast: the assignment cast to TEXT covers uuid, integer
and text ids, and an existing UUID record_id still takes uuid ids. A trigger created with the
argument 'no_notify' (SchemaOptions.WithoutNotify) writes the row without the NOTIFY, which a
transaction that is to be prepared (PREPARE TRANSACTION) must not send.
*/ -}}
CREATE OR REPLACE FUNCTION {{.Function}}() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $body$
DECLARE
    changelog_id BIGINT;
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO {{.Changelog}} (table_name, record_id, operation, new_values)
        VALUES (TG_TABLE_NAME, NEW.id, TG_OP, to_jsonb(NEW))
        RETURNING id INTO changelog_id;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO {{.Changelog}} (table_name, record_id, operation, old_values, new_values)
        VALUES (TG_TABLE_NAME, NEW.id, TG_OP, to_jsonb(OLD), to_jsonb(NEW))
        RETURNING id INTO changelog_id;
    ELSE
        INSERT INTO {{.Changelog}} (table_name, record_id, operation, old_values)
        VALUES (TG_TABLE_NAME, OLD.id, TG_OP, to_jsonb(OLD))
        RETURNING id INTO changelog_id;
    END IF;
    IF TG_NARGS = 0 OR TG_ARGV[0] <> 'no_notify' THEN
        PERFORM pg_notify({{.Channel}}, json_build_object(
            'id', changelog_id, 'table', TG_TABLE_NAME, 'operation', TG_OP)::text);
    END IF;
    RETURN NULL;
END
$body$;

{{/* ---- begin: trigger function privileges ----
The trigger function runs with the rights of its owner, the changelog's owner, so writers of
captured tables need no privilege on the changelog or its sequence, and cannot insert changelog
rows themselves. Its search_path is pinned to pg_catalog, the changelog's schema (where the
unqualified changelog name was found at install time: the installer's search_path) and pg_temp
last, so no writer's search_path or temporary object changes what its body refers to. The names
come from the catalog and are quoted by format(); the function body itself runs no dynamic SQL.
*/ -}}
DO $definer$
DECLARE
    fn  regprocedure := to_regprocedure({{.FunctionLiteral}});
    nsp name;
    own oid;
BEGIN
    SELECT n.nspname, c.relowner INTO nsp, own
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = to_regclass({{.ChangelogLiteral}});
    EXECUTE format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp', fn, nsp);
    IF (SELECT proowner FROM pg_proc WHERE oid = fn) <> own THEN
        EXECUTE format('ALTER FUNCTION %s OWNER TO %I', fn, (SELECT rolname FROM pg_roles WHERE oid = own));
    END IF;
END
$definer$;
{{- /* ---- end: trigger function privileges ---- */}}
