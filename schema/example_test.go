package schema_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"strings"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver

	"github.com/pgchangestream/pgchangestream/schema"
)

// Install the changelog, the token table and the trigger function, then capture the changes of
// two tables: the orders, and the health events of a store whose rows carry a node name, kept
// in order per node for shared clients.
func Example_installAndCapture() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://migrator@localhost:5432/shop")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	if _, err := schema.Install(ctx, db, schema.Options{}); err != nil {
		log.Fatal(err)
	}
	if _, err := schema.Capture(ctx, db, "orders", schema.Options{}); err != nil {
		log.Fatal(err)
	}
	opts := schema.Options{Key: "document.healthevent.nodename"}
	if _, err := schema.Capture(ctx, db, "health_events", opts); err != nil {
		log.Fatal(err)
	}
}

// A dry run needs no database: it returns the statements to review, or to run with psql.
func Example_dryRun() {
	ctx := context.Background()
	opts := schema.Options{ChangelogTable: "audit.changes", DryRun: true}

	install, err := schema.Install(ctx, nil, opts)
	if err != nil {
		log.Fatal(err)
	}
	capture, err := schema.Capture(ctx, nil, "audit.orders", opts)
	if err != nil {
		log.Fatal(err)
	}
	for _, stmt := range append(install.Statements, capture.Statements...) {
		fmt.Println(strings.SplitN(stmt, "\n", 2)[0])
	}
	// Output:
	// SELECT pg_advisory_xact_lock(8099551800421515265);
	// CREATE INDEX CONCURRENTLY IF NOT EXISTS "changes_stream_idx" ON "audit"."changes" (table_name, changed_at, id)
	// CREATE INDEX CONCURRENTLY IF NOT EXISTS "changes_txid_unit_idx" ON "audit"."changes" (table_name, txid, id, (COALESCE(unit, "audit"."changes_unit"(record_id::text))))
	// CREATE INDEX CONCURRENTLY IF NOT EXISTS "changes_unprocessed_idx" ON "audit"."changes" (changed_at) WHERE processed = FALSE
	// CREATE INDEX CONCURRENTLY IF NOT EXISTS "changes_table_record_idx" ON "audit"."changes" (table_name, record_id)
	// DO $capture$
}

// Keep a tenant's role to its own table and its own consumers: its watchers stream only the
// changelog rows of invoices, and it can read and move only the saved tokens of its clients.
// Run as the owner of the changelog and the token table.
func Example_restrictTenant() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://migrator@localhost:5432/shop")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	if _, err := schema.RestrictReads(ctx, db, "tenant_a", []string{"invoices"}, schema.Options{}); err != nil {
		log.Fatal(err)
	}
	clients := []string{"tenant_a-billing", "tenant_a-audit"}
	if _, err := schema.RestrictTokens(ctx, db, "tenant_a", clients, schema.Options{}); err != nil {
		log.Fatal(err)
	}
	// Later, to lift both:
	//	schema.RemoveRestrictions(ctx, db, "tenant_a", schema.Options{})
}
