// Package document builds the change event documents of changelog rows and decodes their JSON:
// the machinery behind the root package's Event, EventWithToken.UnmarshalDocument and
// Document. It needs no database.
//
// # The path of one event
//
// [Decode] is the one entry, row → event document:
//
//  1. With Options.Lazy (Config.RawDocuments), lazy checks the row's JSON columns with
//     scanObject (scan.go: exactly what encoding/json accepts) and, where it can vouch for
//     them, builds the event without its documents.
//  2. Otherwise [Build] makes the event: each column the operation needs is decoded by
//     [UnmarshalObject] (decode.go: scanJSON, then github.com/goccy/go-json or encoding/json),
//     unwrapped from Options.Field (unwrapDocument) and, for an update, diffed into
//     updatedFields (diffInto, or diffStoreClient).
//  3. [Raw] keeps the row, so that a typed read later decodes fullDocument straight from the
//     text (Raw.Unmarshal: fullDocumentJSON, checked by canonicalJSON in canonical.go, then
//     [DecodeBytes] in typed.go) when that gives what the map round trip ([UnmarshalMap])
//     gives, and through the map otherwise.
package document
