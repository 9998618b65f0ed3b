package changelog

// RestrictedTokens returns the SQL condition that a restrictive row-level security policy of the
// token table (table, an expression of type regclass) applies to the current role, which then
// does not see every client's token. admin.Prune and the SQL retention function (schema/prune.sql)
// refuse such a role ([RestrictedTokensMessage]).
func RestrictedTokens(table string) string {
	return `COALESCE(row_security_active(` + table + `), false) AND EXISTS (
	SELECT FROM pg_policy p WHERE p.polrelid = ` + table + ` AND NOT p.polpermissive
	AND EXISTS (SELECT FROM unnest(p.polroles) r WHERE r = 0 OR pg_has_role(current_user, r, 'USAGE')))`
}

// RestrictedTokensSQL reads RestrictedTokens of the token table $1.
var RestrictedTokensSQL = `SELECT ` + RestrictedTokens("to_regclass($1)")

// RestrictedTokensMessage is the refusal of a role restricted by RestrictTokens to prune; %s is
// the token table.
const RestrictedTokensMessage = "token table %s hides other clients' tokens from this role (RestrictTokens): " +
	"prune as the table's owner or a BYPASSRLS role, which see every token"
