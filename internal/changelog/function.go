package changelog

import (
	"fmt"
	"strings"
)

// FunctionColumns are the columns of a function's state (FunctionState), from pg_proc p, with
// the changelog's schema in cl.nspname: its name, whether it runs as its owner, whether its
// search_path is the one the install script pins, and whether its body reads the trigger
// arguments (the library's does; a plain log_table_changes() body does not).
const FunctionColumns = `p.oid::regprocedure::text, p.prosecdef,
	COALESCE(format('search_path=pg_catalog, %I, pg_temp', cl.nspname) = ANY (p.proconfig), false),
	strpos(p.prosrc, 'TG_ARGV') > 0`

// SchemaCTE names the changelog's schema ($1, the quoted changelog) as cl.nspname.
const SchemaCTE = `WITH cl AS (SELECT n.nspname, c.oid FROM pg_catalog.pg_class c
	JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1))`

// FunctionState is what the catalog says of a trigger function.
type FunctionState struct {
	Name      string // regprocedure, schema-qualified where it is not on the search_path
	Definer   bool   // SECURITY DEFINER
	Pinned    bool   // search_path = pg_catalog, <changelog's schema>, pg_temp
	ReadsArgs bool   // the body reads TG_ARGV
}

// ScanDest returns the scan destinations of FunctionColumns.
func (f *FunctionState) ScanDest() []any {
	return []any{&f.Name, &f.Definer, &f.Pinned, &f.ReadsArgs}
}

// Problem describes how f differs from the function schema.Install installs, or returns "".
func (f FunctionState) Problem() string {
	var what []string
	if !f.Definer {
		what = append(what, "is not SECURITY DEFINER (writers without changelog grants get \"permission denied for table\")")
	}
	if !f.Pinned {
		what = append(what, "has no pinned search_path")
	}
	if !f.ReadsArgs {
		what = append(what, "has a body that ignores the trigger arguments (key, no_notify)")
	}
	if len(what) == 0 {
		return ""
	}
	return fmt.Sprintf("trigger function %s is not the one schema.Install installs: it %s", f.Name, strings.Join(what, ", "))
}

// ReplacedBy names the DDL that replaces the library's trigger function with a plain one.
const ReplacedBy = "such as a service's CREATE OR REPLACE FUNCTION with a plain body"

// RepairHint says how to put the library's schema back.
const RepairHint = "re-apply the schema: schema.Install (pgchangestream schema install), then schema.Capture " +
	"for each captured table (pgchangestream schema capture [--key PATH] [--no-notify] TABLE, with the options it was captured with)"
