package pgchangestream

import (
	"fmt"
	"strings"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
)

// DefaultHealthEventsKey is the [SchemaOptions.Key] that [CaptureChanges] gives the table named
// health_events when none is set: the node name of the row's health event, as the store's rows
// ({id, document: {healthevent: {nodename, ...}, ...}, created_at, ...}) hold it, so that the
// events of one node keep one unit and are read in order by one shared member. A row whose
// event spells it otherwise (healthevent.nodeName) gets the unit of its record id.
const DefaultHealthEventsKey = "document.healthevent.nodename"

// healthEventsTable is the table whose default key is DefaultHealthEventsKey.
const healthEventsTable = "health_events"

// Key paths: at most maxKeyParts parts, each of letters, digits and _.
const maxKeyParts = 8

// keyArgPrefix starts the trigger argument that names the key path (schema/install.sql).
const keyArgPrefix = "key="

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
	args := []string{changelog.QuoteLiteral(notifyArg)}
	if withoutNotify {
		args[0] = changelog.QuoteLiteral(noNotifyArg)
	}
	if key != "" {
		args = append(args, changelog.QuoteLiteral(keyArgPrefix+key))
	}
	return strings.Join(args, ", ")
}
