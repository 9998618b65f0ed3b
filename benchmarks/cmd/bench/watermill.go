package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
)

// watermillTopic is the topic the watermill scenario publishes to and drains.
const watermillTopic = "bench"

// watermillPublishChunk is the number of messages per Publish call (one INSERT each).
const watermillPublishChunk = 500

// watermillDrain publishes n messages with watermill-sql's PostgreSQL publisher, then drains
// them with its subscriber (default PostgreSQL schema and offsets adapters, batches of 100,
// database/sql over the pgx stdlib driver), acknowledging each. It returns the time from
// Subscribe until the last message was acknowledged. Payloads are the same JSON documents as
// the changelog rows' new_values; the consumer does not decode them.
func watermillDrain(ctx context.Context, e *env, n int) (time.Duration, error) {
	d, err := e.newDatabase(ctx)
	if err != nil {
		return 0, err
	}
	defer d.drop(ctx)
	db := wmsql.BeginnerFromStdSQL(d.DB)
	schema := wmsql.DefaultPostgreSQLSchema{SubscribeBatchSize: 100}
	pub, err := wmsql.NewPublisher(db, wmsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, nil)
	if err != nil {
		return 0, err
	}
	for from := 0; from < n; from += watermillPublishChunk {
		msgs := make([]*message.Message, 0, watermillPublishChunk)
		for i := from; i < min(from+watermillPublishChunk, n); i++ {
			msgs = append(msgs, message.NewMessage(watermill.NewUUID(), itemDocument(i+1)))
		}
		if err := pub.Publish(watermillTopic, msgs...); err != nil {
			return 0, fmt.Errorf("watermill publish: %w", err)
		}
	}
	if err := pub.Close(); err != nil {
		return 0, err
	}

	sub, err := wmsql.NewSubscriber(db, wmsql.SubscriberConfig{
		ConsumerGroup:  "bench",
		SchemaAdapter:  schema,
		OffsetsAdapter: wmsql.DefaultPostgreSQLOffsetsAdapter{},
	}, nil)
	if err != nil {
		return 0, err
	}
	defer func() { _ = sub.Close() }()
	if err := sub.SubscribeInitialize(watermillTopic); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, drainTimeout)
	defer cancel()
	start := time.Now()
	msgs, err := sub.Subscribe(ctx, watermillTopic)
	if err != nil {
		return 0, err
	}
	for i := range n {
		select {
		case msg, ok := <-msgs:
			if !ok {
				return 0, fmt.Errorf("watermill: messages closed after %d of %d", i, n)
			}
			msg.Ack()
		case <-ctx.Done():
			return 0, fmt.Errorf("watermill: %d of %d messages: %w", i, n, ctx.Err())
		}
	}
	return time.Since(start), nil
}

// itemDocument is the JSON the trigger writes for items row i (to_jsonb of the row).
func itemDocument(i int) []byte {
	b, _ := json.Marshal(map[string]any{
		"id": i, "n": i,
		"doc": map[string]any{
			"name": fmt.Sprintf("item-%d", i), "status": "active", "count": i,
			"labels": map[string]any{"zone": fmt.Sprintf("zone-%d", i%8), "tier": "gold"},
			"tags":   []string{"alpha", "beta", "gamma"},
		},
	})
	return b
}
