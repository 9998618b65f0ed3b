// Package changelog holds the names of the objects the library keeps beside a changelog table,
// and the checks and quoting every name passes before it reaches SQL.
//
// A name is "name" or "schema.name", each part an unquoted-style identifier of letters, digits,
// _ and $ that PostgreSQL does not truncate. The objects beside a changelog take its name with a
// suffix, in its schema: "<changelog>_parked", "<changelog>_acks", and so on. The watcher, the
// public schema and admin packages and the test kit all name them through this package, so they
// cannot disagree. It also holds what the watcher's runtime checks and retention share with the
// schema package: the catalog reads of the trigger function's state (FunctionState), the rule by
// which a saved token certifies changelog rows (Certified), and the key's unit (UnitOf).
package changelog
