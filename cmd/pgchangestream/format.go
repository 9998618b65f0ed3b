package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/pgchangestream/pgchangestream"
)

// eventTimeFormat is the time of an event in pretty output: UTC, microseconds as stored.
const eventTimeFormat = "2006-01-02T15:04:05.000000Z07:00"

// writeJSONEvent writes the event document with its "token" as one line of JSON.
func writeJSONEvent(w *bufio.Writer, ev pgchangestream.EventWithToken) error {
	doc := make(map[string]any, len(ev.Event)+1)
	maps.Copy(doc, ev.Event)
	doc["token"] = string(ev.ResumeToken)
	enc := json.NewEncoder(w) // Encode ends the line
	enc.SetEscapeHTML(false)
	return enc.Encode(doc)
}

// writePrettyEvent writes "id operation table key time" and the fields the change set: every
// field of an inserted document, the changed fields of an update, none for a delete.
func writePrettyEvent(w *bufio.Writer, ev pgchangestream.EventWithToken) error {
	e := ev.Event
	op, _ := e["operationType"].(string)
	var coll, key any
	if ns, ok := e["ns"].(map[string]any); ok {
		coll = ns["coll"]
	}
	if dk, ok := e["documentKey"].(map[string]any); ok {
		key = dk["_id"]
	}
	when := "-"
	if t, ok := e["clusterTime"].(time.Time); ok {
		when = t.UTC().Format(eventTimeFormat)
	}
	fmt.Fprintf(w, "%s %s %v %v %s", ev.ResumeToken, op, coll, key, when)
	var fields map[string]any
	switch op {
	case "insert":
		fields, _ = e["fullDocument"].(map[string]any)
	case "update":
		if ud, ok := e["updateDescription"].(map[string]any); ok {
			fields, _ = ud["updatedFields"].(map[string]any)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(fields)) {
		if op == "insert" && name == "id" {
			continue // it is the key
		}
		fmt.Fprintf(w, " %s=%s", name, compactValue(fields[name]))
	}
	return w.WriteByte('\n')
}

// compactValue formats a field value as compact JSON (strings quoted, objects inline).
func compactValue(v any) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return fmt.Sprint(v)
	}
	return string(bytes.TrimRight(b.Bytes(), "\n"))
}
