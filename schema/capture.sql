{{- /*
Attaches the trigger function to a table, checking first that the table exists and has an id
column whose type the changelog's record_id can take (an existing changelog has a UUID
record_id). The advisory lock makes the check-then-create safe against a concurrent run. The
trigger is created only when missing: no DROP TRIGGER, which would lock out readers. Args is the
trigger's argument list: empty (notify) or 'no_notify' (WithoutNotify); an existing trigger of
the other kind is reported, not replaced.
*/ -}}
DO $capture$
DECLARE
    target      regclass := to_regclass({{.TableLiteral}});
    changelog   regclass := to_regclass({{.ChangelogLiteral}});
    id_type     oid;
    record_type oid;
    quiet       boolean;
BEGIN
    PERFORM pg_advisory_xact_lock({{.LockKey}});
    IF target IS NULL THEN
        RAISE EXCEPTION 'table % does not exist', {{.TableLiteral}}
            USING ERRCODE = 'undefined_table';
    END IF;
    SELECT atttypid INTO id_type FROM pg_attribute
    WHERE attrelid = target AND attname = 'id' AND attnum > 0 AND NOT attisdropped;
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
    SELECT tgnargs > 0 INTO quiet FROM pg_trigger WHERE tgrelid = target AND tgname = {{.TriggerLiteral}};
    IF quiet IS NULL THEN
        CREATE TRIGGER {{.Trigger}} AFTER INSERT OR UPDATE OR DELETE ON {{.Table}}
            FOR EACH ROW EXECUTE FUNCTION {{.Function}}({{.Args}});
    ELSIF quiet <> {{.WithoutNotify}} THEN
        RAISE EXCEPTION 'trigger % on % exists and %: drop it to capture changes %',
            {{.TriggerLiteral}}, target,
            CASE WHEN quiet THEN 'does not notify' ELSE 'notifies' END,
            CASE WHEN quiet THEN 'with NOTIFY' ELSE 'without NOTIFY' END
            USING ERRCODE = 'duplicate_object';
    END IF;
END
$capture$
