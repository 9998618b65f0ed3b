package pgchangestream

import (
	"os"
	"strconv"
	"strings"
	"unicode"
)

// DatastoreConnString returns the connection string the store-client's PostgreSQL datastore
// (datastore.LoadDatastoreConfig, then datastore.NewDataStore) builds from its environment
// (DATASTORE_PROVIDER=postgresql), so that a service whose
// watcher this package replaces can hand its LISTEN connection the server, database and
// credentials the store-client connects with; the store-client keeps its own string
// unexported. It reads, through getenv (os.Getenv when nil), the store-client's variables
// with its defaults:
//
//	DATASTORE_HOST          host         default localhost
//	DATASTORE_PORT          port         default 5432 (also when not a number)
//	DATASTORE_DATABASE      dbname       default nvsentinel
//	DATASTORE_USERNAME      user         left out when empty
//	DATASTORE_PASSWORD      password     left out when empty
//	DATASTORE_SSLMODE       sslmode      default prefer
//	DATASTORE_SSLCERT       sslcert      left out when empty
//	DATASTORE_SSLKEY        sslkey       left out when empty
//	DATASTORE_SSLROOTCERT   sslrootcert  left out when empty
//
// The store-client reads no password file. The result is a key=value string for
// [Config.ConnString], each value quoted where it has to be (the store-client quotes only the
// password). Settings the store-client takes from DATASTORE_YAML or DATASTORE_YAML_PATH instead
// are not read.
func DatastoreConnString(getenv func(string) string) string {
	if getenv == nil {
		getenv = os.Getenv
	}
	or := func(key, def string) string {
		if v := getenv(key); v != "" {
			return v
		}
		return def
	}
	port := 5432
	if p, err := strconv.Atoi(getenv("DATASTORE_PORT")); err == nil {
		port = p
	}
	params := []string{
		"host=" + quoteConnValue(or("DATASTORE_HOST", "localhost")),
		"port=" + strconv.Itoa(port),
		"dbname=" + quoteConnValue(or("DATASTORE_DATABASE", "nvsentinel")),
	}
	for _, p := range []struct{ key, env string }{
		{"user", "DATASTORE_USERNAME"}, {"password", "DATASTORE_PASSWORD"},
	} {
		if v := getenv(p.env); v != "" {
			params = append(params, p.key+"="+quoteConnValue(v))
		}
	}
	params = append(params, "sslmode="+quoteConnValue(or("DATASTORE_SSLMODE", "prefer")))
	for _, p := range []struct{ key, env string }{
		{"sslcert", "DATASTORE_SSLCERT"}, {"sslkey", "DATASTORE_SSLKEY"}, {"sslrootcert", "DATASTORE_SSLROOTCERT"},
	} {
		if v := getenv(p.env); v != "" {
			params = append(params, p.key+"="+quoteConnValue(v))
		}
	}
	return strings.Join(params, " ")
}

// quoteConnValue quotes a value of a key=value connection string when it is empty or holds
// white space, a backslash or a single quote.
func quoteConnValue(v string) string {
	if v != "" && !strings.ContainsAny(v, `\'`) && !strings.ContainsFunc(v, unicode.IsSpace) {
		return v
	}
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}
