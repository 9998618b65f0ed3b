{{- /*
Tables and trigger function. InstallSchema sends this as one Exec call, so its commands run as
one implicit transaction. The advisory lock serializes concurrent runs: CREATE ... IF NOT EXISTS
and CREATE OR REPLACE FUNCTION can still race on the catalog.

A missing changelog is created together with its indexes (cheap on an empty table). An existing
changelog, possibly the existing schema's with a UUID record_id, is left as it is; the indexes it
lacks are built concurrently by the statements that follow this one. (A plain CREATE INDEX IF NOT
EXISTS would take a lock that blocks writers before it finds that the index exists.)
*/ -}}
SELECT pg_advisory_xact_lock({{.LockKey}});

DO $install$
BEGIN
    IF to_regclass({{.ChangelogLiteral}}) IS NULL THEN
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
{{- range .Indexes}}
        {{.}};
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
record_id takes NEW.id / OLD.id without a cast: the assignment cast to TEXT covers uuid, integer
and text ids, and an existing UUID record_id still takes uuid ids.
*/ -}}
CREATE OR REPLACE FUNCTION {{.Function}}() RETURNS trigger
LANGUAGE plpgsql AS $body$
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
    PERFORM pg_notify({{.Channel}}, json_build_object(
        'id', changelog_id, 'table', TG_TABLE_NAME, 'operation', TG_OP)::text);
    RETURN NULL;
END
$body$;
