package admin_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/pgchangestream/pgchangestream"
	"github.com/pgchangestream/pgchangestream/admin"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
)

// List every client's saved token and what it has not passed yet.
func ExampleListTokens() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	tokens, err := admin.ListTokens(ctx, db, admin.Options{})
	if err != nil {
		log.Fatal(err)
	}
	for _, t := range tokens {
		b, err := admin.Backlog(ctx, db, t.Token, "", admin.Options{})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s: saved %s, %d rows behind (oldest %s)\n", t.Client, t.UpdatedAt.Format(time.RFC3339), b.Rows, b.Lag)
	}
}

// Move a stopped client back, so that it delivers again every row written in the last hour:
// first a dry run that shows the token the reset would save, then the reset itself.
func ExampleResetToken() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	to := admin.ResetTarget{Time: time.Now().Add(-time.Hour), Table: "orders", DryRun: true}
	pos, err := admin.ResetToken(ctx, db, "billing", to, admin.Options{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("would save", pos.Token(to.Table))

	to.DryRun = false
	_, err = admin.ResetToken(ctx, db, "billing", to, admin.Options{})
	if errors.Is(err, pgchangestream.ErrClientActive) {
		log.Fatal("stop the billing watchers first")
	}
	if err != nil {
		log.Fatal(err)
	}
}

// Delete the changelog rows older than a day that every client has passed, and name the
// clients that hold rows back.
func ExamplePrune() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://localhost/app")
	if err != nil {
		log.Fatal(err)
	}
	res, err := admin.Prune(ctx, db, admin.PruneOptions{OlderThan: 24 * time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("deleted %d rows in %d batches\n", res.Deleted, res.Batches)
	for _, h := range res.Holders {
		fmt.Printf("client %s holds %d rows back; its token is %s old\n", h.Client, h.Rows, h.Age)
	}
}

// An operator retries the events Process parked for a client once the cause is fixed: the
// client's running Process runs each again at its next look at the dead-letter table.
func ExampleRetryParked() {
	ctx := context.Background()
	db, err := sql.Open("pgx", "postgres://app@localhost:5432/platform")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	parked, err := admin.ListParked(ctx, db, "remediation", admin.Options{})
	if err != nil {
		log.Fatal(err)
	}
	for _, p := range parked {
		fmt.Printf("retrying event %d of key %s (%d attempts, last error %q)\n", p.ChangelogID, p.Key, p.Attempts, p.Error)
		if err := admin.RetryParked(ctx, db, "remediation", p.ID, admin.Options{}); err != nil {
			log.Fatal(err)
		}
	}
}
