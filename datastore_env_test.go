package pgchangestream

import (
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

func TestDatastoreConnString(t *testing.T) {
	env := func(vars map[string]string) func(string) string {
		return func(key string) string { return vars[key] }
	}
	t.Run("defaults", func(t *testing.T) {
		require.Equal(t, "host=localhost port=5432 dbname=nvsentinel sslmode=prefer", DatastoreConnString(env(nil)))
	})
	t.Run("every variable", func(t *testing.T) {
		got := DatastoreConnString(env(map[string]string{
			"DATASTORE_HOST": "pg.nvsentinel.svc", "DATASTORE_PORT": "6543", "DATASTORE_DATABASE": "db1",
			"DATASTORE_USERNAME": "svc", "DATASTORE_PASSWORD": `p w'\d`, "DATASTORE_SSLMODE": "verify-full",
			"DATASTORE_SSLCERT": "/certs/tls.crt", "DATASTORE_SSLKEY": "/certs/tls.key", "DATASTORE_SSLROOTCERT": "/certs/ca.crt",
		}))
		require.Equal(t, `host=pg.nvsentinel.svc port=6543 dbname=db1 user=svc password='p w\'\\d' sslmode=verify-full`+
			` sslcert=/certs/tls.crt sslkey=/certs/tls.key sslrootcert=/certs/ca.crt`, got)
	})
	t.Run("a port that is not a number", func(t *testing.T) {
		require.Contains(t, DatastoreConnString(env(map[string]string{"DATASTORE_PORT": "x"})), " port=5432 ")
	})
	t.Run("parsed as written", func(t *testing.T) {
		pc, err := pgconn.ParseConfig(DatastoreConnString(env(map[string]string{
			"DATASTORE_HOST": "h", "DATASTORE_PORT": "6543", "DATASTORE_DATABASE": "my db",
			"DATASTORE_USERNAME": "u", "DATASTORE_PASSWORD": `p w'\d`, "DATASTORE_SSLMODE": "disable",
		})))
		require.NoError(t, err)
		require.Equal(t, "h", pc.Host)
		require.Equal(t, uint16(6543), pc.Port)
		require.Equal(t, "my db", pc.Database)
		require.Equal(t, "u", pc.User)
		require.Equal(t, `p w'\d`, pc.Password)
		require.Nil(t, pc.TLSConfig)
	})
	t.Run("os environment", func(t *testing.T) {
		t.Setenv("DATASTORE_HOST", "from-env")
		require.Contains(t, DatastoreConnString(nil), "host=from-env ")
	})
}
