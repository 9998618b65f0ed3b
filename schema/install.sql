{{- /*
Tables and trigger function. schema.Install sends this as one Exec call, so its commands run as
one implicit transaction. The advisory lock serializes concurrent runs: CREATE ... IF NOT EXISTS
and CREATE OR REPLACE FUNCTION can still race on the catalog.

A missing changelog is created together with its indexes (cheap on an empty table). An existing
changelog, possibly the existing schema's with a UUID record_id, keeps its rows and columns; on
PostgreSQL 13 and later it gains the txid column; the indexes it lacks are built concurrently by
the statements that follow this one. (A plain CREATE INDEX IF NOT EXISTS would take a lock that
blocks writers before it finds that the index exists.)
*/ -}}
SELECT pg_advisory_xact_lock({{.LockKey}});

{{/*
The unit of a row's key (Go: UnitOf): the first four bytes of its MD5 digest, big-endian,
modulo 1024. The trigger function writes it for tables captured with a key, and the unit index
is built on it, so it must never change.
*/ -}}
CREATE OR REPLACE FUNCTION {{.UnitFunction}}(key text) RETURNS smallint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
AS $unit$SELECT (('x' || left(md5($1), 8))::bit(32)::bigint % 1024)::smallint$unit$;

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
        -- lock_timeout for transactions using the table (schema.Install then tries again).
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
        -- The unit of the row's key, for shared clients; NULL stands for the unit of the record
        -- id. Nullable without a default: a catalog change only.
        IF NOT EXISTS (SELECT FROM pg_attribute
                       WHERE attrelid = changelog AND attname = '{{.UnitColumn}}' AND NOT attisdropped) THEN
            ALTER TABLE {{.Changelog}} ADD COLUMN {{.UnitColumn}} smallint;
        END IF;
        PERFORM set_config('lock_timeout', timeout, true);
        -- One row, which crash recovery empties (the table is unlogged) and a promoted standby or
        -- a restored backup does not have: watchers compare its value with the one they saw, to
        -- notice that the transaction counter may have gone back below ids they saw finish.
        -- Any watcher role reads it and inserts it again after a crash, with its default value
        -- only (INSERT on the column one): a role that chose the value could put back the one
        -- watchers saw before the crash, and hide the crash from them.
        CREATE UNLOGGED TABLE IF NOT EXISTS {{.Incarnation}} (
            one         boolean PRIMARY KEY DEFAULT TRUE CHECK (one),
            incarnation uuid NOT NULL DEFAULT gen_random_uuid()
        );
        REVOKE INSERT ON {{.Incarnation}} FROM PUBLIC;
        GRANT SELECT, INSERT (one) ON {{.Incarnation}} TO PUBLIC;
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
The members of shared clients (Config.Shared) and their ranges: a member's row lives while its
lease (on the server's clock) is renewed; its id comes from the sequence and is never reused.
Each client has a row per range (units range_no*16 to range_no*16+15), with the member owning
it (NULL while free) and the range's saved position.
*/ -}}
CREATE SEQUENCE IF NOT EXISTS {{.MemberSequence}};
CREATE TABLE IF NOT EXISTS {{.Members}} (
    client_name VARCHAR(255) NOT NULL,
    member      BIGINT NOT NULL,
    name        TEXT NOT NULL,
    lease_until TIMESTAMPTZ NOT NULL,
    joined_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    valid_since TIMESTAMPTZ NOT NULL DEFAULT now(), -- since when the lease has held without a lapse
    PRIMARY KEY (client_name, member)
);
CREATE TABLE IF NOT EXISTS {{.Ranges}} (
    client_name  VARCHAR(255) NOT NULL,
    range_no     SMALLINT NOT NULL CHECK (range_no >= 0 AND range_no < 64),
    owner        BIGINT,
    resume_token JSONB NOT NULL,
    last_updated TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (client_name, range_no)
);

{{/*
The owner epoch fences the saves of exclusive watchers. A nullable column without a default is
a catalog change only (no rewrite); its ACCESS EXCLUSIVE lock waits at most lock_timeout for the
saves in flight (schema.Install then tries again). Old watchers leave it alone.
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
The captured tables: those schema.Capture attached the trigger function to, by schema and name
(names, not oids, survive a dump and restore). The trigger function writes changelog rows only
for a table listed here or owned by a role that has the changelog owner's privileges (which could
write the changelog itself); any other relation that fires it (a temporary table, another role's
table) is refused. Only the owner writes this table. Every role may read it (the catalog shows every
role which tables have a trigger on the function anyway): while an installation is upgraded, a
writer's statement that began before the upgrade committed may run the new body without
SECURITY DEFINER, as the writer, which still holds its old grants on the changelog. When it is
created, on an existing installation, it adopts the tables whose triggers already execute the
function (not temporary ones): the tables the old runtime DDL or migrations captured.
*/ -}}
DO $captured$
DECLARE
    fn regprocedure := to_regprocedure({{.FunctionLiteral}});
BEGIN
    IF to_regclass({{.CapturedLiteral}}) IS NULL THEN
        CREATE TABLE {{.Captured}} (
            schema_name name NOT NULL,
            table_name  name NOT NULL,
            captured_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (schema_name, table_name)
        );
        GRANT SELECT ON {{.Captured}} TO PUBLIC;
        INSERT INTO {{.Captured}} (schema_name, table_name)
        SELECT DISTINCT n.nspname, c.relname
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE fn IS NOT NULL AND t.tgfoid = fn AND c.relpersistence <> 't';
    END IF;
END
$captured$;

{{/*
record_id takes NEW.id / OLD.id without a cast: the assignment cast to TEXT covers uuid, integer
and text ids, and an existing UUID record_id still takes uuid ids. A trigger created with the
argument 'no_notify' (schema.Options.WithoutNotify) writes the row without the NOTIFY, which a
transaction that is to be prepared (PREPARE TRANSACTION) must not send. A trigger created with
the argument 'key=<path>' (schema.Options.Key; the arguments come in any order) writes the unit of
the value at that path of the row (the new one, the old one for deletes) into the unit column, or
NULL where the path holds nothing; without it the INSERTs name no unit column, so they work on a
changelog without one. It first refuses (raises, so the write fails) a relation that is not
captured (see the captured table above): TG_TABLE_NAME is all the changelog records of the
relation, so a relation of the same name elsewhere (a temporary one above all) would otherwise
pass its rows off as the captured table's. current_user is the function's owner (SECURITY
DEFINER), the changelog's. A listed table costs one index probe per row; another table of the
owner's one more catalog lookup.
*/ -}}
CREATE OR REPLACE FUNCTION {{.Function}}() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $body$
DECLARE
    changelog_id BIGINT;
    notify       boolean := true;
    key_path     text[];
    doc          jsonb;
BEGIN
    IF NOT EXISTS (SELECT FROM {{.Captured}} k WHERE k.schema_name = TG_TABLE_SCHEMA AND k.table_name = TG_TABLE_NAME)
        AND NOT EXISTS (SELECT FROM pg_class c WHERE c.oid = TG_RELID AND c.relpersistence <> 't'
                        AND pg_has_role(c.relowner, current_user, 'USAGE')) THEN
        RAISE EXCEPTION 'table %.% is not captured (not in %, not the changelog owner''s): its changes cannot be recorded',
            TG_TABLE_SCHEMA, TG_TABLE_NAME, {{.CapturedLiteral}}
            USING ERRCODE = 'insufficient_privilege',
                HINT = 'schema.Capture (pgchangestream schema capture), run as the changelog''s owner, captures a table';
    END IF;
    FOR i IN 0 .. TG_NARGS - 1 LOOP
        IF TG_ARGV[i] = 'no_notify' THEN
            notify := false;
        ELSIF left(TG_ARGV[i], {{len .KeyPrefix}}) = '{{.KeyPrefix}}' THEN
            key_path := string_to_array(substr(TG_ARGV[i], {{len .KeyPrefix}} + 1), '.');
        END IF;
    END LOOP;
    IF key_path IS NOT NULL THEN
        IF TG_OP = 'INSERT' THEN
            doc := to_jsonb(NEW);
            INSERT INTO {{.Changelog}} (table_name, record_id, operation, new_values, {{.UnitColumn}})
            VALUES (TG_TABLE_NAME, NEW.id, TG_OP, doc, {{.UnitFunction}}(doc #>> key_path))
            RETURNING id INTO changelog_id;
        ELSIF TG_OP = 'UPDATE' THEN
            doc := to_jsonb(NEW);
            INSERT INTO {{.Changelog}} (table_name, record_id, operation, old_values, new_values, {{.UnitColumn}})
            VALUES (TG_TABLE_NAME, NEW.id, TG_OP, to_jsonb(OLD), doc, {{.UnitFunction}}(doc #>> key_path))
            RETURNING id INTO changelog_id;
        ELSE
            doc := to_jsonb(OLD);
            INSERT INTO {{.Changelog}} (table_name, record_id, operation, old_values, {{.UnitColumn}})
            VALUES (TG_TABLE_NAME, OLD.id, TG_OP, doc, {{.UnitFunction}}(doc #>> key_path))
            RETURNING id INTO changelog_id;
        END IF;
    ELSIF TG_OP = 'INSERT' THEN
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
    IF notify THEN
        PERFORM pg_notify({{.Channel}}, json_build_object(
            'id', changelog_id, 'table', TG_TABLE_NAME, 'operation', TG_OP)::text);
    END IF;
    RETURN NULL;
END
$body$;

{{/* ---- begin: trigger function privileges ----
The trigger function runs with the rights of its owner, the changelog's owner, so writers of
captured tables need no privilege on the changelog or its sequence, and cannot insert changelog
rows themselves. Firing a trigger needs no EXECUTE on its function, creating one does: EXECUTE is
revoked from PUBLIC (the owner keeps it), so no other role can attach the function to a relation
of its own (grants to named roles are left as they are). Its search_path is pinned to
pg_catalog, the changelog's schema (where the unqualified changelog name was found at install
time: the installer's search_path) and pg_temp last, so no writer's search_path or temporary
object changes what its body refers to. The names
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
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', fn);
END
$definer$;
{{- /* ---- end: trigger function privileges ---- */}}
