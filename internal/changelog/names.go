package changelog

// The default names of the objects, shared by the watcher's Config and the schema options.
const (
	DefaultChangelogTable = "datastore_changelog"
	DefaultTokenTable     = "resume_tokens"
	DefaultNotifyChannel  = "nvsentinel_changes"
	// DefaultTriggerFunction is the existing schema's name, so triggers that already call it
	// pick up the function the schema installs.
	DefaultTriggerFunction = "log_table_changes"
)

// TxidColumn is the upgraded changelog's column holding the writing transaction's id
// (xid8, PostgreSQL 13 and later).
const TxidColumn = "txid"

// EpochColumn is the token table's column of an exclusive client's owner epoch.
const EpochColumn = "owner_epoch"

// HealthEventsTable is the table whose default key is DefaultHealthEventsKey.
const HealthEventsTable = "health_events"

// DefaultHealthEventsKey is the key the schema's Capture gives the table named health_events
// when none is set: the node name of the row's health event, as the store's rows
// ({id, document: {healthevent: {nodename, ...}, ...}, created_at, ...}) hold it, so that the
// events of one node keep one unit and are read in order by one shared member. A row whose
// event spells it otherwise (healthevent.nodeName) gets the unit of its record id.
const DefaultHealthEventsKey = "document.healthevent.nodename"

// UnitColumn is the changelog's column of a row's unit, written by the trigger function from
// the row's key; NULL stands for the unit of the record id.
const UnitColumn = "unit"

// TriggerName is the trigger the schema attaches to a captured table: "<name>_changes", cut to
// 63 bytes as PostgreSQL cuts it, so a trigger created with the long name is found again.
func TriggerName(table string) string {
	name := Unqualified(table) + "_changes"
	return name[:min(len(name), MaxIdentifierLen)]
}

// IncarnationTable is the unlogged one-row table beside changelog ("<name>_incarnation") whose
// row crash recovery and promotion lose: watchers compare its value to notice that transaction
// ids they saw may have been handed out again.
func IncarnationTable(changelog string) string { return changelog + "_incarnation" }

// ParkedTable is the dead-letter table of Process beside changelog ("<name>_parked").
func ParkedTable(changelog string) string { return changelog + "_parked" }

// AckTable is the table of transactional handlers' acknowledgement rows beside changelog
// ("<name>_acks").
func AckTable(changelog string) string { return changelog + "_acks" }

// CapturedTable lists the tables captured into changelog ("<name>_captured"): the trigger
// function writes changelog rows for them (and for tables of the changelog's owner) only.
func CapturedTable(changelog string) string { return changelog + "_captured" }

// PruneFunction is the SQL retention function of the changelog ("<name>_prune").
func PruneFunction(changelog string) string { return changelog + "_prune" }

// UnitFunction is the SQL twin of the unit of a key beside changelog ("<name>_unit"):
// unit(key text) smallint.
func UnitFunction(changelog string) string { return changelog + "_unit" }

// UnitExpression is the SQL expression of a changelog row's unit, exactly as the unit index of
// changelog is built on it, so that a condition on it is an index condition.
func UnitExpression(changelog string) string {
	return "COALESCE(" + UnitColumn + ", " + Quote(UnitFunction(changelog)) + "(record_id::text))"
}

// MemberTable holds the members of shared clients beside changelog ("<name>_members").
func MemberTable(changelog string) string { return changelog + "_members" }

// MemberSequence hands out the member ids of MemberTable, never reused ("<name>_member_seq").
func MemberSequence(changelog string) string { return changelog + "_member_seq" }

// RangeTable holds each shared client's ranges, their owners and saved positions, beside
// changelog ("<name>_ranges").
func RangeTable(changelog string) string { return changelog + "_ranges" }

// MaxTableNameLen is the length, in characters, of the changelog's table_name column
// (VARCHAR(100)).
const MaxTableNameLen = 100
