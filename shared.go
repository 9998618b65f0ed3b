package pgchangestream

import (
	"crypto/md5"
	"encoding/binary"
)

const (
	// SharedUnits is the number of units a row's key hashes to. A row's unit is fixed when the
	// row is written (see [UnitOf]).
	SharedUnits = 1024
	// SharedRanges is the number of ranges the units are grouped in for [Config.Shared]: range
	// r holds the units r*16 to r*16+15. A range is the part of a client's rows that has one
	// saved position and one owner at a time; members divide the ranges between them.
	SharedRanges = 64
	// unitsPerRange is the number of units in a range.
	unitsPerRange = SharedUnits / SharedRanges
)

// UnitOf returns the unit of a row whose key is key: the first four bytes of the key's MD5
// digest, as a big-endian number, modulo [SharedUnits]. It is the Go twin of the changelog's
// SQL function <changelog>_unit(text), which the trigger function and the changelog's index use,
// and gives the same value on every PostgreSQL version.
func UnitOf(key string) int {
	sum := md5.Sum([]byte(key))
	return int(binary.BigEndian.Uint32(sum[:4]) % SharedUnits)
}
