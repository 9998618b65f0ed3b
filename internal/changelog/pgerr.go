package changelog

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// PostgreSQL's error codes the library tells apart.
const (
	LockNotAvailable = "55P03" // a lock_timeout or NOWAIT
	UndefinedTable   = "42P01"
)

// HasCode reports whether err is, or wraps, a PostgreSQL error with code.
func HasCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}
