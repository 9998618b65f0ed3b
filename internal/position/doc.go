// Package position holds the places in a change stream and their text forms: [Position] and its
// order, the pg_snapshot deltas an upgraded changelog is read in ([Snapshot], [DeltaRanges]),
// the saved-token JSON ([EncodeToken], [DecodeToken]) and the resume token of a delivery
// ([FormatToken], [ParseToken]). It does no I/O. The root package aliases [Position]; the
// watcher, the admin package and the test kit all encode and parse tokens through this one.
package position
