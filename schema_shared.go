package pgchangestream

import (
	"fmt"
	"strings"
)

// DefaultHealthEventsKey is the [SchemaOptions.Key] that [CaptureChanges] gives the table named
// health_events when none is set: the node name of the row's health event, as the store's rows
// ({id, document: {healthevent: {nodename, ...}, ...}, created_at, ...}) hold it, so that the
// events of one node keep one unit and are read in order by one shared member. A row whose
// event spells it otherwise (healthevent.nodeName) gets the unit of its record id.
const DefaultHealthEventsKey = "document.healthevent.nodename"

// healthEventsTable is the table whose default key is DefaultHealthEventsKey.
const healthEventsTable = "health_events"

// unitColumn is the changelog's column of a row's unit (see [UnitOf]), written by the trigger
// function from the row's key; NULL stands for the unit of the record id.
const unitColumn = "unit"

// Key paths: at most maxKeyParts parts, each of letters, digits and _.
const maxKeyParts = 8

// keyArgPrefix starts the trigger argument that names the key path (schema/install.sql).
const keyArgPrefix = "key="

// unitFunction is the SQL twin of UnitOf beside changelog (same schema, name "<name>_unit"):
// unit(key text) smallint.
func unitFunction(changelog string) string {
	return changelog + "_unit"
}

// unitExpression is the SQL expression of a changelog row's unit, exactly as the unit index of
// changelog is built on it, so that a condition on it is an index condition.
func unitExpression(changelog string) string {
	return "COALESCE(" + unitColumn + ", " + quoteIdentifier(unitFunction(changelog)) + "(record_id::text))"
}

// memberTable holds the members of shared clients beside changelog (same schema, name
// "<name>_members").
func memberTable(changelog string) string {
	return changelog + "_members"
}

// memberSequence hands out the member ids of memberTable, never reused (same schema, name
// "<name>_member_seq").
func memberSequence(changelog string) string {
	return changelog + "_member_seq"
}

// rangeTable holds each shared client's ranges, their owners and saved positions, beside
// changelog (same schema, name "<name>_ranges").
func rangeTable(changelog string) string {
	return changelog + "_ranges"
}

// checkKeyPath validates a key path: dot-separated parts of letters, digits and _, at most
// maxKeyParts of them.
func checkKeyPath(path string) error {
	parts := strings.Split(path, ".")
	if len(parts) > maxKeyParts {
		return fmt.Errorf("%w: SchemaOptions.Key: %q has %d parts, more than %d",
			ErrInvalidConfig, path, len(parts), maxKeyParts)
	}
	for i, part := range parts {
		if part == "" {
			return fmt.Errorf("%w: SchemaOptions.Key: %q: part %d is empty", ErrInvalidConfig, path, i+1)
		}
		for _, r := range part {
			if !(r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
				return fmt.Errorf("%w: SchemaOptions.Key: %q: part %q holds a character other than "+
					"letters, digits and _", ErrInvalidConfig, path, part)
			}
		}
	}
	return nil
}

// triggerArgs returns the argument list of the trigger function, each a quoted literal:
// 'no_notify' if withoutNotify, else 'notify', then 'key=<path>' if key is set. A trigger of
// CaptureChanges always has an argument, so one without any is not CaptureChanges' (other DDL
// created it, or an earlier release, which left a notifying trigger without a key bare).
func triggerArgs(withoutNotify bool, key string) string {
	args := []string{quoteLiteral(notifyArg)}
	if withoutNotify {
		args[0] = quoteLiteral(noNotifyArg)
	}
	if key != "" {
		args = append(args, quoteLiteral(keyArgPrefix+key))
	}
	return strings.Join(args, ", ")
}
