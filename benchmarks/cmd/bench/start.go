package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/pgchangestream/pgchangestream"
)

// saveStart starts a watcher with cfg (a client without a saved token) on the changelog as it is
// now, waits until it has saved its start position and made its first read, and closes it. The
// client's saved token is then a position before every row written afterwards: the current
// snapshot on the upgraded schema, after the newest row on the legacy one. A backlog written
// next is read by the client's next watcher as a running client reads new rows: in snapshot
// deltas on the upgraded schema, in (changed_at, id) order on the legacy one.
//
// A drain cannot use a new client with StartFromBeginning instead: on the upgraded schema that
// is a switch-over, whose first phase reads every row visible at Start in (changed_at, id)
// order, so the backlog would be read as on the legacy schema.
func (d *database) saveStart(ctx context.Context, cfg pgchangestream.Config) error {
	w, err := pgchangestream.New(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, drainTimeout)
	defer cancel()
	w.Start(ctx)
	select {
	case <-w.Ready():
	case <-ctx.Done():
	}
	if err := w.Err(); err != nil {
		_ = w.Close(ctx)
		return fmt.Errorf("save the start position of %s: %w", cfg.ClientName, err)
	}
	if err := w.Close(ctx); err != nil {
		return fmt.Errorf("save the start position of %s: %w", cfg.ClientName, err)
	}
	return d.checkTokenForm(ctx, cfg.ClientName)
}

// checkTokenForm fails unless the saved token of client has the form of its schema's reads: a
// "snapshot" field and no "switchover" on the upgraded schema (the client reads in snapshot
// deltas), neither on the legacy one. Checked on the start position and after each drain, it
// keeps a figure of one variant from measuring the other's reads.
func (d *database) checkTokenForm(ctx context.Context, client string) error {
	var raw []byte
	if err := d.QueryRowContext(ctx, `SELECT resume_token::text FROM `+tokenTable+` WHERE client_name = $1`,
		client).Scan(&raw); err != nil {
		return fmt.Errorf("read the saved token of %s: %w", client, err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return fmt.Errorf("saved token of %s: %w", client, err)
	}
	_, snapshot := fields["snapshot"]
	_, switchover := fields["switchover"]
	if want := d.variant == upgraded; snapshot != want || switchover {
		reads := "snapshot-delta reads (a \"snapshot\" field, no \"switchover\")"
		if !want {
			reads = "legacy reads (neither \"snapshot\" nor \"switchover\")"
		}
		return fmt.Errorf("%s schema: saved token %s of %s is not of %s", d.variant, raw, client, reads)
	}
	return nil
}
