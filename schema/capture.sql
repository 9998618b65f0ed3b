{{- /*
Attaches the trigger function to a table, checking first that the table exists and has an id
column whose type the changelog's record_id can take (an existing changelog has a UUID
record_id). The advisory lock makes the check-then-create safe against a concurrent run. The
trigger is created only when missing, with no DROP TRIGGER (its ACCESS EXCLUSIVE lock would lock
out readers), but for the repair below. Args is the trigger's argument list: 'no_notify'
(WithoutNotify) or 'notify' (which the trigger function ignores: it is there so that every
trigger schema.Capture creates has an argument), then 'key=<path>' (the key, given or the
table's default) when set; PlainArgs the same without the key, used when the key is only a
default and the changelog has no unit column. An existing trigger's arguments (tgargs: each one
followed by a zero byte) are read back: one that notifies the other way is reported, and so is
one with another key than ExplicitKey (a key given); without one it is kept as it is. An existing
trigger without arguments, which schema.Capture never creates, is dropped and created again with
the arguments asked for, in the same transaction (the table stays locked until the commit, a
moment): it is what other DDL leaves (a service's start-up that drops the trigger and creates it
again without arguments) or an earlier release made, so running schema.Capture again with the
options a table was captured with restores its key and no_notify. The table is
added to the captured tables (Captured), which the trigger function writes for, whether its
trigger was there or not; a temporary table is refused (the function never writes for one). On a
changelog schema.Install has not upgraded yet there is no such table: the install adopts the
tables whose triggers exist then.
*/ -}}
DO $capture$
DECLARE
    target      regclass := to_regclass({{.TableLiteral}});
    changelog   regclass := to_regclass({{.ChangelogLiteral}});
    id_type     oid;
    record_type oid;
    found_args  text[];
    quiet       boolean;
    row_key      text := {{.Key}};
    explicit_key text := {{.ExplicitKey}};
    current_key  text;
BEGIN
    PERFORM pg_advisory_xact_lock({{.LockKey}});
    IF target IS NULL THEN
        RAISE EXCEPTION 'table % does not exist', {{.TableLiteral}}
            USING ERRCODE = 'undefined_table';
    END IF;
    SELECT atttypid INTO id_type FROM pg_attribute
    WHERE attrelid = target AND attname = 'id' AND attnum > 0 AND NOT attisdropped;
    IF (SELECT relpersistence FROM pg_class WHERE oid = target) = 't' THEN
        RAISE EXCEPTION 'table % is temporary: its changes cannot be captured', target
            USING ERRCODE = 'wrong_object_type';
    END IF;
    IF id_type IS NULL THEN
        RAISE EXCEPTION 'table % has no column "id" (it is stored as the changelog record_id)',
            target USING ERRCODE = 'undefined_column';
    END IF;
    IF changelog IS NULL THEN
        RAISE EXCEPTION 'changelog table % does not exist (install the schema first)',
            {{.ChangelogLiteral}} USING ERRCODE = 'undefined_table';
    END IF;
    SELECT atttypid INTO record_type FROM pg_attribute
    WHERE attrelid = changelog AND attname = 'record_id' AND attnum > 0 AND NOT attisdropped;
    IF record_type IS NULL THEN
        RAISE EXCEPTION 'changelog table % has no column "record_id"', changelog
            USING ERRCODE = 'undefined_column';
    END IF;
    IF record_type <> id_type
        AND NOT EXISTS (SELECT FROM pg_type WHERE oid = record_type AND typcategory = 'S')
        AND NOT EXISTS (SELECT FROM pg_cast WHERE castsource = id_type AND casttarget = record_type
                        AND castcontext IN ('a', 'i')) THEN
        RAISE EXCEPTION 'column %.id is %, which %.record_id (%) cannot store',
            target, id_type::regtype, changelog, record_type::regtype
            USING ERRCODE = 'datatype_mismatch';
    END IF;
    IF to_regclass({{.CapturedLiteral}}) IS NOT NULL THEN
        INSERT INTO {{.Captured}} (schema_name, table_name)
        SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.oid = target
        ON CONFLICT DO NOTHING;
    END IF;
    SELECT array_remove(string_to_array(encode(tgargs, 'escape'), E'\\000'), '') INTO found_args
    FROM pg_trigger WHERE tgrelid = target AND tgname = {{.TriggerLiteral}};
    IF cardinality(found_args) = 0 THEN
        DROP TRIGGER {{.Trigger}} ON {{.Table}}; -- created without arguments by other DDL: made again below
        found_args := NULL;
    END IF;
    IF found_args IS NULL THEN
        IF row_key IS NULL OR EXISTS (SELECT FROM pg_attribute WHERE attrelid = changelog
                                  AND attname = {{.UnitColumn}} AND NOT attisdropped) THEN
            CREATE TRIGGER {{.Trigger}} AFTER INSERT OR UPDATE OR DELETE ON {{.Table}}
                FOR EACH ROW EXECUTE FUNCTION {{.Function}}({{.Args}});
        ELSIF explicit_key IS NULL THEN
            CREATE TRIGGER {{.Trigger}} AFTER INSERT OR UPDATE OR DELETE ON {{.Table}}
                FOR EACH ROW EXECUTE FUNCTION {{.Function}}({{.PlainArgs}});
        ELSE
            RAISE EXCEPTION 'changelog table % has no column "unit" for the key % (run schema.Install on PostgreSQL 13 or later)',
                changelog, explicit_key USING ERRCODE = 'undefined_column';
        END IF;
        RETURN;
    END IF;
    quiet := {{.NoNotify}} = ANY (found_args);
    SELECT substr(a, length({{.KeyPrefix}}) + 1) INTO current_key
    FROM unnest(found_args) WITH ORDINALITY AS u(a, n)
    WHERE left(a, length({{.KeyPrefix}})) = {{.KeyPrefix}} ORDER BY n DESC LIMIT 1;
    IF quiet <> {{.WithoutNotify}} THEN
        RAISE EXCEPTION 'trigger % on % exists and %: drop it to capture changes %',
            {{.TriggerLiteral}}, target,
            CASE WHEN quiet THEN 'does not notify' ELSE 'notifies' END,
            CASE WHEN quiet THEN 'with NOTIFY' ELSE 'without NOTIFY' END
            USING ERRCODE = 'duplicate_object';
    END IF;
    IF current_key IS DISTINCT FROM explicit_key AND explicit_key IS NOT NULL THEN
        RAISE EXCEPTION 'trigger % on % exists with key %, not %: drop it to change the key (a new key moves a key''s new rows to another unit than its earlier ones)',
            {{.TriggerLiteral}}, target, COALESCE(current_key, '(the record id)'), explicit_key
            USING ERRCODE = 'duplicate_object';
    END IF;
END
$capture$