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

// watermillRuns counts the calls of watermillDrains, whose consumers take turns going first.
var watermillRuns int

// watermillDrains publishes n messages with watermill-sql's PostgreSQL publisher, then drains
// them twice with its subscriber (default PostgreSQL schema and offsets adapters, batches of
// 100, database/sql over the pgx stdlib driver), in two consumer groups: one whose consumer
// only acknowledges each message (raw), and one whose consumer first decodes the payload into
// a map[string]any with encoding/json, as a consumer of our events receives them (decode).
// The two go first in turns, call after call. Each time is from Subscribe until the last
// message was acknowledged. Payloads are the same JSON documents as the changelog rows'
// new_values.
func watermillDrains(ctx context.Context, e *env, n int) (raw, decode time.Duration, err error) {
	d, err := e.newDatabase(ctx, upgraded)
	if err != nil {
		return 0, 0, err
	}
	defer d.drop(ctx)
	db := wmsql.BeginnerFromStdSQL(d.DB)
	schema := wmsql.DefaultPostgreSQLSchema{SubscribeBatchSize: 100}
	pub, err := wmsql.NewPublisher(db, wmsql.PublisherConfig{SchemaAdapter: schema, AutoInitializeSchema: true}, nil)
	if err != nil {
		return 0, 0, err
	}
	for from := 0; from < n; from += watermillPublishChunk {
		msgs := make([]*message.Message, 0, watermillPublishChunk)
		for i := from; i < min(from+watermillPublishChunk, n); i++ {
			msgs = append(msgs, message.NewMessage(watermill.NewUUID(), itemDocument(i+1)))
		}
		if err := pub.Publish(watermillTopic, msgs...); err != nil {
			return 0, 0, fmt.Errorf("watermill publish: %w", err)
		}
	}
	if err := pub.Close(); err != nil {
		return 0, 0, err
	}
	watermillRuns++
	for i := range 2 {
		if (i+watermillRuns)%2 == 0 {
			raw, err = watermillConsume(ctx, db, schema, "raw", n, false)
		} else {
			decode, err = watermillConsume(ctx, db, schema, "decode", n, true)
		}
		if err != nil {
			return 0, 0, err
		}
	}
	return raw, decode, nil
}

// watermillConsume subscribes as consumer group to the topic and acknowledges n messages,
// decoding each payload first if decode is set. It returns the time from Subscribe until the
// last acknowledgement.
func watermillConsume(ctx context.Context, db wmsql.Beginner, schema wmsql.SchemaAdapter, group string,
	n int, decode bool) (time.Duration, error) {
	sub, err := wmsql.NewSubscriber(db, wmsql.SubscriberConfig{
		ConsumerGroup:  group,
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
				return 0, fmt.Errorf("watermill %s: messages closed after %d of %d", group, i, n)
			}
			if decode {
				var doc map[string]any
				if err := json.Unmarshal(msg.Payload, &doc); err != nil {
					return 0, fmt.Errorf("watermill %s: message %d: %w", group, i, err)
				}
				sink = doc
			}
			msg.Ack()
		case <-ctx.Done():
			return 0, fmt.Errorf("watermill %s: %d of %d messages: %w", group, i, n, ctx.Err())
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
