package changelog

import (
	"crypto/md5"
	"encoding/binary"
)

// Units is the number of units a row's key hashes to.
const Units = 1024

// UnitOf returns the unit of a row whose key is key: the first four bytes of the key's MD5
// digest, as a big-endian number, modulo [Units]. It is the Go twin of the changelog's SQL
// function <changelog>_unit(text) (UnitFunction), which the trigger function and the
// changelog's index use, and gives the same value on every PostgreSQL version.
func UnitOf(key string) int {
	sum := md5.Sum([]byte(key))
	return int(binary.BigEndian.Uint32(sum[:4]) % Units)
}
