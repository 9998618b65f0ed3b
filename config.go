package pgchangestream

import (
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/pgchangestream/pgchangestream/internal/changelog"
	"github.com/pgchangestream/pgchangestream/internal/document"
	"github.com/pgchangestream/pgchangestream/internal/match"
)

// Defaults for the zero values of [Config].
const (
	DefaultMode                   = ModeHybrid
	DefaultChangelogTable         = changelog.DefaultChangelogTable
	DefaultTokenTable             = changelog.DefaultTokenTable
	DefaultNotifyChannel          = changelog.DefaultNotifyChannel
	DefaultPollInterval           = 10 * time.Millisecond
	DefaultFallbackPollInterval   = time.Second
	DefaultBatchSize              = 100
	DefaultBufferSize             = 100
	DefaultMaxPending             = 4096
	DefaultIdleCheckpointInterval = time.Second
	// DefaultCheckpointRefreshInterval is the default [Config.CheckpointRefreshInterval].
	DefaultCheckpointRefreshInterval = time.Minute
	DefaultLockSessionTimeout        = 30 * time.Second
	DefaultSharedLease               = 5 * time.Second
)

// Limits of [Config]: larger sizes, shorter intervals and longer names are invalid. The sizes
// bound what [New] allocates: a ring of MaxPending entries, two batches of BatchSize rows and a
// channel of BufferSize events.
const (
	// MaxBatchSize is the largest BatchSize.
	MaxBatchSize = 100_000
	// MaxBufferSize is the largest BufferSize.
	MaxBufferSize = 100_000
	// MaxMaxPending is the largest MaxPending.
	MaxMaxPending = 1 << 20
	// MinInterval is the shortest PollInterval, FallbackPollInterval, IdleCheckpointInterval,
	// CheckpointRefreshInterval and positive CheckpointInterval.
	MinInterval = time.Millisecond
	// MinLockSessionTimeout and MaxLockSessionTimeout bound LockSessionTimeout.
	MinLockSessionTimeout = 4 * time.Second
	MaxLockSessionTimeout = 24 * time.Hour
	// MinSharedLease and MaxSharedLease bound SharedLease.
	MinSharedLease = time.Second
	MaxSharedLease = 5 * time.Minute
	// MaxMemberNameLen is the longest MemberName, in characters.
	MaxMemberNameLen = 255
	// MaxClientNameLen is the length, in characters, of the token table's client_name column
	// (VARCHAR(255)).
	MaxClientNameLen = 255
	// MaxTableNameLen is the length, in characters, of the changelog's table_name column
	// (VARCHAR(100)).
	MaxTableNameLen = changelog.MaxTableNameLen
)

// Config configures a [Watcher]. Zero values take the defaults stated on each field.
type Config struct {
	// DB runs reads and checkpoint writes. Required. Use the pgx stdlib driver
	// (github.com/jackc/pgx/v5/stdlib).
	DB *sql.DB
	// ConnString is the connection string of the dedicated LISTEN connection. Empty: hybrid
	// mode degrades to polling (with a warning) and notify mode is a config error.
	ConnString string
	// ClientName keys the saved resume token. Required; at most [MaxClientNameLen] characters
	// of valid UTF-8 without NUL.
	ClientName string
	// TableName selects the changelog rows to stream (their table_name column, which holds the
	// bare table name, without a schema). Required; at most [MaxTableNameLen] characters of
	// valid UTF-8 without NUL. [Watcher.Start] warns when no changelog row and no table with a
	// trigger has this name.
	TableName string
	// Mode is polling, notify or hybrid. Default ModeHybrid.
	Mode Mode

	// ChangelogTable is the trigger-filled changelog. Default "datastore_changelog".
	ChangelogTable string
	// TokenTable holds one saved token per client. Default "resume_tokens".
	TokenTable string
	// NotifyChannel is the channel the trigger notifies. Default "nvsentinel_changes".
	NotifyChannel string

	// PollInterval is the wait after a short read in polling mode. Default 10ms; at least
	// [MinInterval].
	PollInterval time.Duration
	// FallbackPollInterval is the wait after a short read in hybrid mode when no NOTIFY
	// arrives; each wait is jittered by up to a fifth. Default 1s; at least [MinInterval].
	FallbackPollInterval time.Duration
	// BatchSize is the number of rows per read. Default 100; at most [MaxBatchSize].
	BatchSize int
	// BufferSize is the capacity of the Events channel. Default 100; at most [MaxBufferSize].
	// A Shared member's Events channel has no buffer: a paused member must not have events
	// waiting for its consumer when it wakes (docs/operations.md, "Shared consumers").
	BufferSize int
	// MaxPending bounds the deliveries tracked until acknowledged; beyond it the oldest is
	// folded into a floor the saved token cannot pass. Default 4096; at most [MaxMaxPending].
	MaxPending int
	// IdleCheckpointInterval is how often, at most, the watcher saves a checkpoint that moved
	// with nothing pending (rows skipped by Filter). Default 1s; at least [MinInterval].
	IdleCheckpointInterval time.Duration
	// CheckpointInterval batches checkpoint writes. 0 (default): every MarkProcessed saves
	// before it returns. Positive (at least [MinInterval]): MarkProcessed acknowledges in
	// memory and returns, and a background saver writes the checkpoint at most once per
	// interval when it changed; Flush and Close save at once. After a crash, acknowledged events
	// since the last save are delivered again.
	CheckpointInterval time.Duration
	// CheckpointRefreshInterval is how often, at most, a watcher with nothing pending saves a
	// checkpoint that no read moved: its saves are otherwise skipped. A watcher caught up on a
	// table without writes thereby keeps its token's snapshot recent (on an upgraded changelog
	// the snapshot moves with every other transaction, and admin.Prune keeps every row the saved
	// snapshot does not see) and its saved time fresh (so a token not saved for much longer
	// belongs to no running watcher). The background saver checks it on its ticks (every
	// IdleCheckpointInterval, or CheckpointInterval when batched). Default 1m; at least
	// [MinInterval].
	CheckpointRefreshInterval time.Duration

	// Exclusive makes at most one watcher per ClientName deliver at a time. Each holds a
	// session advisory lock (keyed by TokenTable and ClientName) on a connection of its own
	// (ConnString when set, else one held out of DB); the others wait as standbys and take
	// over, from the saved token, within a few seconds of the active watcher closing, its
	// context ending, or its session ending. A watcher that loses its session stops (Err wraps
	// [ErrExclusiveLost]) before a standby starts. Watchers without Exclusive and with a
	// ConnString hold the lock in shared mode, so an exclusive watcher waits for them too.
	// On a token table with the owner_epoch column (schema.Install adds it), each active
	// watcher claims a new owner epoch and its saves are fenced to it: once a standby took
	// over, a save of the earlier owner, however late, is refused (wrapping [ErrFenced]).
	Exclusive bool
	// LockSessionTimeout bounds, with Exclusive, how long the lock session of a watcher whose
	// host vanished without closing its connections keeps the lock: the session's TCP
	// keepalives and TCP user timeout (set on both ends) end it within about this time, and a
	// standby takes over a few seconds later. Default 30s; between [MinLockSessionTimeout] and
	// [MaxLockSessionTimeout]. A network outage longer than this ends the session too.
	LockSessionTimeout time.Duration

	// Shared makes the watchers of one ClientName, in any number of processes, divide its
	// rows: each committed row goes to one active member, and the rows of one key (fixed when
	// the row is written, see schema.Options.Key) to one member at a time, in order. The
	// members coordinate in PostgreSQL through the changelog's _members and _ranges tables
	// (schema.Install creates them): the 1,024 units of the key hash are grouped in
	// [SharedRanges] ranges, each with its own saved position and fenced owner, and the live
	// members divide the ranges between them. A range moves to a new member only after its
	// old owner's deliveries in it were acknowledged, or the old owner's lease ran out.
	// Requires an upgraded changelog (with the txid column). Exclusive is the one-member
	// case: setting both, or Shared with Ephemeral or ProcessedFlag, is an [ErrInvalidConfig].
	// [Watcher.ProcessTx] fences each event's claim by its range; [Watcher.MarkProcessedTx]
	// is refused. docs/operations.md ("Shared consumers") explains sizing and the failure model.
	Shared bool
	// SharedLease is how long a Shared member keeps its ranges without renewing its lease.
	// It renews every fifth of it and stops delivering before it runs out; other members take
	// over the ranges of a member whose lease ran out (a crash, a pause, a lost network).
	// Default 5s; between [MinSharedLease] and [MaxSharedLease].
	SharedLease time.Duration
	// MemberName names a Shared member in status, logs and metrics. Default: host name and
	// process id. At most [MaxMemberNameLen] characters.
	MemberName string

	// Ephemeral makes the watcher never write the token table (nor the processed flag): it
	// resumes after the client's saved token if there is one, else starts as a new client
	// without saving that start, and acknowledgements only free pending deliveries. For
	// inspection tools, such as the command's tail without --client.
	Ephemeral bool

	// StartFromBeginning makes a client with no saved token start at the oldest row of its
	// table instead of the newest.
	StartFromBeginning bool
	// ProcessedFlag makes the watcher set the legacy "processed" column of the rows its saved
	// token certifies, for deployments that still run the existing schema's
	// cleanup_changelog(days) function, the flag's only reader. Default false: [New] leaves
	// the column alone, which keeps changelog updates HOT-free rewrites out of the drain (see
	// docs/operations.md). [NewPostgreSQLChangeStreamWatcher], the drop-in constructor, sets
	// it. Setting it together with DisableProcessedFlag is an [ErrInvalidConfig].
	ProcessedFlag bool
	// DisableProcessedFlag skips the legacy "processed = TRUE" update. It is the default of
	// [New] now; setting it keeps that default explicit and contradicts ProcessedFlag.
	DisableProcessedFlag bool
	// DocumentField, if set, makes fullDocument (and fullDocumentBeforeChange) the JSON
	// object in this field of the row, with "id" set to the record id and, when the row has a
	// created_at column and the object no "createdAt" key, "createdAt" set to it. A row without
	// an object in this field is published whole, with a warning.
	// [NewPostgreSQLChangeStreamWatcher] sets "document" for the table health_events.
	DocumentField string
	// RawDocuments makes the watcher keep the JSON text of inserted and updated documents
	// instead of decoding them: events have fullDocument nil and no updateDescription, and
	// [Document] and [EventWithToken.UnmarshalDocument] decode straight into the caller's type.
	// The event methods (GetRecordUUID, GetNodeName, UpdatedFields) still work, decoding the
	// documents on each call. For consumers that read documents only as structs. A Filter (and a
	// Pipeline) sees the events without documents. Deletes, and rows whose columns may fail to
	// decode (checked when read), are decoded as without it. Default false.
	RawDocuments bool
	// Filter, if set, is called for every event read; events for which it returns false are
	// not delivered, and the saved position moves past them.
	Filter func(Event) bool
	// Pipeline, if set, is a MongoDB-style pipeline of $match stages that New compiles as
	// [MatchFilter] does (with StoreClientCompat, as the store-client watcher evaluated it); an
	// invalid pipeline is an [ErrInvalidConfig]. An event is delivered when it passes both
	// Pipeline and Filter.
	Pipeline []map[string]any
	// StoreClientCompat makes the watcher deliver what the store-client watcher it replaces
	// delivered, where the two differ in ways a service can tell:
	//   - Pipeline is evaluated as that watcher's filter did: $exists never holds (unless
	//     ExtendedFilters is set), $gt, $gte, $lt and $lte hold only between two numbers, and
	//     {} as a field's value holds for any value;
	//   - updateDescription.updatedFields is that watcher's diff: a key removed from the
	//     document, a nested key that goes from absent to null, and an object emptied out are
	//     not listed (a top-level key that goes from absent to null is).
	// [NewPostgreSQLChangeStreamWatcher] sets it; New leaves it off unless set here.
	StoreClientCompat bool
	// ExtendedFilters, with StoreClientCompat, evaluates $exists in Pipeline, as the
	// store-client did for a pipeline wrapped by client.WithExtendedFilters. Without
	// StoreClientCompat, $exists is always evaluated and this field changes nothing.
	ExtendedFilters bool
	// Logger receives the watcher's logs, each with the client name. Default slog.Default().
	Logger *slog.Logger
	// Observer, if set, is told of each changelog read and checkpoint save, with its duration
	// and error, for traces (see [Observer]). Default nil.
	Observer Observer
}

// WithDefaults returns cfg with every zero field replaced by its default, as [New] fills them
// (the Default… constants, slog.Default() for Logger). It does not validate cfg.
func (cfg Config) WithDefaults() Config {
	if cfg.Mode == "" {
		cfg.Mode = DefaultMode
	}
	if cfg.ChangelogTable == "" {
		cfg.ChangelogTable = DefaultChangelogTable
	}
	if cfg.TokenTable == "" {
		cfg.TokenTable = DefaultTokenTable
	}
	if cfg.NotifyChannel == "" {
		cfg.NotifyChannel = DefaultNotifyChannel
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.FallbackPollInterval == 0 {
		cfg.FallbackPollInterval = DefaultFallbackPollInterval
	}
	if cfg.BatchSize == 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.BufferSize == 0 {
		cfg.BufferSize = DefaultBufferSize
	}
	if cfg.MaxPending == 0 {
		cfg.MaxPending = DefaultMaxPending
	}
	if cfg.IdleCheckpointInterval == 0 {
		cfg.IdleCheckpointInterval = DefaultIdleCheckpointInterval
	}
	if cfg.CheckpointRefreshInterval == 0 {
		cfg.CheckpointRefreshInterval = DefaultCheckpointRefreshInterval
	}
	if cfg.LockSessionTimeout == 0 {
		cfg.LockSessionTimeout = DefaultLockSessionTimeout
	}
	if cfg.SharedLease == 0 {
		cfg.SharedLease = DefaultSharedLease
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// validate reports the first problem of a defaulted config, naming the field.
func (cfg Config) validate() error {
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case cfg.DB == nil:
		return invalid("Config.DB is required")
	case strings.TrimSpace(cfg.ClientName) == "":
		return invalid("Config.ClientName is required")
	case strings.TrimSpace(cfg.TableName) == "":
		return invalid("Config.TableName is required")
	}
	for _, f := range []struct {
		name, value string
		max         int
	}{
		{"Config.ClientName", cfg.ClientName, MaxClientNameLen},
		{"Config.TableName", cfg.TableName, MaxTableNameLen},
	} {
		if err := changelog.CheckText(f.value, f.max); err != nil {
			return invalid("%s: %v", f.name, err)
		}
	}
	if cfg.ProcessedFlag && cfg.DisableProcessedFlag {
		return invalid("Config.ProcessedFlag and Config.DisableProcessedFlag contradict each other: set at most one")
	}
	if cfg.Shared {
		switch {
		case cfg.Exclusive:
			return invalid("Config.Shared and Config.Exclusive contradict each other: Exclusive is the one-member case of Shared")
		case cfg.Ephemeral:
			return invalid("Config.Shared needs saved positions: it cannot be Ephemeral")
		case cfg.marksProcessed():
			return invalid("Config.Shared cannot set the legacy processed flag (Config.ProcessedFlag): members certify rows per range")
		case cfg.SharedLease < MinSharedLease || cfg.SharedLease > MaxSharedLease:
			return invalid("Config.SharedLease must be between %v and %v, got %v", MinSharedLease, MaxSharedLease, cfg.SharedLease)
		}
		if err := changelog.CheckText(cfg.MemberName, MaxMemberNameLen); err != nil {
			return invalid("Config.MemberName: %v", err)
		}
	}
	switch cfg.Mode {
	case ModePolling, ModeHybrid:
	case ModeNotify:
		if cfg.ConnString == "" {
			return invalid("Config.ConnString is required in notify mode")
		}
	default:
		return invalid("Config.Mode %q is not one of polling, notify, hybrid", cfg.Mode)
	}
	for _, f := range []struct {
		name, value string
	}{
		{"Config.ChangelogTable", cfg.ChangelogTable},
		{"Config.TokenTable", cfg.TokenTable},
	} {
		if err := changelog.CheckName(f.value); err != nil {
			return invalid("%s: %v", f.name, err)
		}
	}
	if err := changelog.CheckChannel(cfg.NotifyChannel); err != nil {
		return invalid("Config.NotifyChannel: %v", err)
	}
	for _, f := range []struct {
		name  string
		value time.Duration
	}{
		{"Config.PollInterval", cfg.PollInterval},
		{"Config.FallbackPollInterval", cfg.FallbackPollInterval},
		{"Config.IdleCheckpointInterval", cfg.IdleCheckpointInterval},
		{"Config.CheckpointRefreshInterval", cfg.CheckpointRefreshInterval},
	} {
		if f.value < MinInterval {
			return invalid("%s must be at least %v, got %v", f.name, MinInterval, f.value)
		}
	}
	if cfg.CheckpointInterval != 0 && cfg.CheckpointInterval < MinInterval {
		return invalid("Config.CheckpointInterval must be 0 or at least %v, got %v", MinInterval, cfg.CheckpointInterval)
	}
	if cfg.LockSessionTimeout < MinLockSessionTimeout || cfg.LockSessionTimeout > MaxLockSessionTimeout {
		return invalid("Config.LockSessionTimeout must be between %v and %v, got %v",
			MinLockSessionTimeout, MaxLockSessionTimeout, cfg.LockSessionTimeout)
	}
	for _, f := range []struct {
		name       string
		value, max int
	}{
		{"Config.BatchSize", cfg.BatchSize, MaxBatchSize},
		{"Config.BufferSize", cfg.BufferSize, MaxBufferSize},
		{"Config.MaxPending", cfg.MaxPending, MaxMaxPending},
	} {
		if f.value < 1 || f.value > f.max {
			return invalid("%s must be between 1 and %d, got %d", f.name, f.max, f.value)
		}
	}
	return nil
}

// withPipeline returns cfg with Pipeline compiled into Filter: both must pass.
func (cfg Config) withPipeline() (Config, error) {
	if len(cfg.Pipeline) == 0 {
		return cfg, nil
	}
	pipeline, err := match.Compile[Event](match.Compiler{StoreClient: cfg.StoreClientCompat, Extended: cfg.ExtendedFilters}, cfg.Pipeline)
	switch {
	case err != nil:
		return cfg, fmt.Errorf("%w: Config.Pipeline: %v", ErrInvalidConfig, err)
	case pipeline == nil: // no conditions
	case cfg.Filter == nil:
		cfg.Filter = pipeline
	default:
		filter := cfg.Filter
		cfg.Filter = func(ev Event) bool { return pipeline(ev) && filter(ev) }
	}
	return cfg, nil
}

// documents returns how events' documents are built.
func (cfg Config) documents() document.Options {
	return document.Options{Field: cfg.DocumentField, StoreClientDiff: cfg.StoreClientCompat, Lazy: cfg.RawDocuments}
}

// marksProcessed reports whether the watcher sets the legacy processed flag.
func (cfg Config) marksProcessed() bool { return cfg.ProcessedFlag && !cfg.DisableProcessedFlag }

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
