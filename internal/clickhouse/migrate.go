package clickhouse

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	ch "github.com/ClickHouse/clickhouse-go/v2"

	"github.com/faultline/faultline/sql"
)

// MigrationsTable records the applied migrations, one row per version.
const MigrationsTable = "schema_migrations"

// Migration is one versioned file, migrations/NNNN_name.sql.
type Migration struct {
	// Version is the file's number prefix; files apply in version order.
	Version uint32
	// File is the file's base name.
	File string
	// Statements are the file's SQL statements, separated by ";".
	Statements []string
	// Checksum is the hex SHA-256 of the file.
	Checksum string

	// sources and sourceIndex are, for a migration made by
	// Schema.ForCluster, the file's statement (and its 1-based number) each
	// statement was translated from; nil for the file as written.
	sources     []string
	sourceIndex []int
}

// source returns the file's statement the i-th (0-based) statement comes
// from, and its 1-based number in the file.
func (m Migration) source(i int) (string, int) {
	if m.sources == nil {
		return m.Statements[i], i + 1
	}
	return m.sources[i], m.sourceIndex[i]
}

// MigrationError is a migration that failed: the file, which statement, and
// the server's error. Transient reports whether it was the server or the
// network failing rather than the migration.
type MigrationError struct {
	File      string
	Statement int // 1-based; 0 when the file itself is bad
	Err       error
}

func (e *MigrationError) Error() string {
	if e.Statement == 0 {
		return fmt.Sprintf("migration %s: %v", e.File, e.Err)
	}
	return fmt.Sprintf("migration %s, statement %d: %v", e.File, e.Statement, e.Err)
}

func (e *MigrationError) Unwrap() error { return e.Err }

// Transient reports whether the migration failed because the server or the
// network did (the connection was lost, a timeout, the server busy, a
// cluster host without a rerun ALTER's columns yet), not because of the
// file: applying it again may succeed, and is safe since every statement
// is idempotent.
func (e *MigrationError) Transient() bool {
	return transient(e.Err) || errors.Is(e.Err, errColumnsNotOnEveryHost)
}

// errColumnsNotOnEveryHost marks a rerun ALTER … ON CLUSTER ADD COLUMN
// answered "already exists" by one host while another lacks the columns:
// not recorded, but transient, since the host may only lag behind (its
// DDL or replication queue, a restart) and have them soon.
var errColumnsNotOnEveryHost = errors.New("the columns are not on every host")

// transientCodes are the ClickHouse exception codes of a server or cluster
// that is failing or busy, not of a statement that is wrong.
var transientCodes = map[int32]bool{
	159: true, // TIMEOUT_EXCEEDED, also an ON CLUSTER query past distributed_ddl_task_timeout
	202: true, // TOO_MANY_SIMULTANEOUS_QUERIES
	209: true, // SOCKET_TIMEOUT
	210: true, // NETWORK_ERROR
	225: true, // NO_ZOOKEEPER
	242: true, // TABLE_IS_READ_ONLY (a replicated table that lost ZooKeeper)
	279: true, // ALL_CONNECTION_TRIES_FAILED
	999: true, // KEEPER_EXCEPTION (ZooKeeper session lost, operation timeout)
}

// transient reports whether err is the server or the network failing: a
// ClickHouse exception with one of transientCodes, or no exception but a
// lost or refused connection or a timeout.
func transient(err error) bool {
	if ex, ok := errors.AsType[*ch.Exception](err); ok {
		return transientCodes[ex.Code]
	}
	_, netErr := errors.AsType[net.Error](err)
	return netErr || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, net.ErrClosed) ||
		errors.Is(err, ch.ErrConnectionClosed) || errors.Is(err, ch.ErrAcquireConnTimeout) ||
		errors.Is(err, context.DeadlineExceeded)
}

// ErrChecksumMismatch is returned when an applied migration's file changed
// afterwards: migrations are append-only, fix forward with a new file.
var ErrChecksumMismatch = errors.New("file changed after it was applied (add a new migration instead)")

var migrationName = regexp.MustCompile(`^([0-9]{4})_[a-z0-9_]+\.sql$`)

// LoadMigrations reads dir of fsys: every *.sql must be named
// NNNN_name.sql with a unique version.
func LoadMigrations(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("read migrations %s: %w", dir, err)
	}
	var out []Migration
	seen := map[uint32]string{}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		m := migrationName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, &MigrationError{File: e.Name(), Err: errors.New("name must be NNNN_lowercase_name.sql")}
		}
		v, _ := strconv.ParseUint(m[1], 10, 32)
		if prev, dup := seen[uint32(v)]; dup {
			return nil, &MigrationError{File: e.Name(), Err: fmt.Errorf("version %s is also used by %s", m[1], prev)}
		}
		seen[uint32(v)] = e.Name()
		b, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", e.Name(), err)
		}
		stmts, err := SplitStatements(string(b))
		if err != nil {
			return nil, &MigrationError{File: e.Name(), Err: err}
		}
		if len(stmts) == 0 {
			return nil, &MigrationError{File: e.Name(), Err: errors.New("no SQL statements")}
		}
		sum := sha256.Sum256(b)
		out = append(out, Migration{Version: uint32(v), File: e.Name(), Statements: stmts, Checksum: hex.EncodeToString(sum[:])})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// SplitStatements splits SQL text on ";" outside quotes and comments, and
// drops comments-only pieces.
func SplitStatements(sql string) ([]string, error) {
	var (
		out   []string
		cur   strings.Builder
		quote byte // ', " or ` while inside a quoted string
		code  bool // cur holds something other than comments and space
	)
	flush := func() {
		if code {
			out = append(out, strings.TrimSpace(cur.String()))
		}
		cur.Reset()
		code = false
	}
	for i := 0; i < len(sql); i++ {
		c := sql[i]
		switch {
		case quote != 0:
			cur.WriteByte(c)
			if c == '\\' && i+1 < len(sql) {
				i++
				cur.WriteByte(sql[i])
			} else if c == quote {
				quote = 0
			}
		case c == '-' && i+1 < len(sql) && sql[i+1] == '-':
			for i < len(sql) && sql[i] != '\n' {
				i++
			}
			cur.WriteByte('\n')
		case c == '/' && i+1 < len(sql) && sql[i+1] == '*':
			end := strings.Index(sql[i+2:], "*/")
			if end < 0 {
				return nil, errors.New("unterminated /* comment")
			}
			i += end + 3
			cur.WriteByte(' ')
		case c == ';':
			flush()
		default:
			if c == '\'' || c == '"' || c == '`' {
				quote = c
			}
			if c != ' ' && c != '\n' && c != '\t' && c != '\r' {
				code = true
			}
			cur.WriteByte(c)
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote", quote)
	}
	flush()
	return out, nil
}

// Applied is one row of the migrations table.
type Applied struct {
	Version  uint32
	File     string
	Checksum string
	At       time.Time
}

// AppliedMigrations reads the migrations table of a single-server schema
// (creating it if missing).
func AppliedMigrations(ctx context.Context, conn Conn) (map[uint32]Applied, error) {
	return appliedMigrations(ctx, conn, Schema{})
}

// appliedMigrations creates the schema's migrations table if missing,
// checks that the database was migrated for this kind of schema, and reads
// the table.
func appliedMigrations(ctx context.Context, conn Conn, s Schema) (map[uint32]Applied, error) {
	if err := conn.Exec(ctx, s.migrationsTableDDL()); err != nil {
		return nil, fmt.Errorf("create %s: %w", MigrationsTable, err)
	}
	if s.Database != "" {
		if err := s.checkMode(ctx, conn); err != nil {
			return nil, err
		}
	}
	return readMigrationsTable(ctx, conn, MigrationsTable)
}

// readAppliedMigrations reads the migrations table of schema s (its
// Database set) through conn, on any database, changing nothing: a
// database or migrations table that does not exist is no migration
// applied, and missing says which. A table made for the other kind of
// schema is refused as appliedMigrations refuses it.
func readAppliedMigrations(ctx context.Context, conn Conn, s Schema) (applied map[uint32]Applied, missing string, err error) {
	var n uint64
	if err := conn.QueryRow(ctx, `SELECT count() FROM system.databases WHERE name = ?`, s.Database).Scan(&n); err != nil {
		return nil, "", fmt.Errorf("look for database %s: %w", s.Database, err)
	}
	if n == 0 {
		return nil, "database " + s.Database + " does not exist", nil
	}
	if err := conn.QueryRow(ctx, `SELECT count() FROM system.tables WHERE database = ? AND name = ?`, s.Database, MigrationsTable).Scan(&n); err != nil {
		return nil, "", fmt.Errorf("look for %s: %w", s.qualified(MigrationsTable), err)
	}
	if n == 0 {
		return nil, "no migrations table in database " + s.Database, nil
	}
	if err := s.checkMode(ctx, conn); err != nil {
		return nil, "", err
	}
	applied, err = readMigrationsTable(ctx, conn, s.qualified(MigrationsTable))
	return applied, "", err
}

// readMigrationsTable reads the migrations table named table.
func readMigrationsTable(ctx context.Context, conn Conn, table string) (map[uint32]Applied, error) {
	rows, err := conn.Query(ctx, `SELECT version, file, checksum, applied FROM `+table+` ORDER BY version, applied LIMIT 1 BY version`)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", table, err)
	}
	defer rows.Close()
	out := map[uint32]Applied{}
	for rows.Next() {
		var a Applied
		if err := rows.Scan(&a.Version, &a.File, &a.Checksum, &a.At); err != nil {
			return nil, fmt.Errorf("read %s: %w", table, err)
		}
		out[a.Version] = a
	}
	return out, rows.Err()
}

// Migrate applies, in version order, the migrations not yet recorded in the
// migrations table, and records each after all its statements succeeded. It
// returns the migrations it applied; applying twice is a no-op. It stops at
// the first failure with a *MigrationError naming the file. Statements must
// be idempotent (IF NOT EXISTS): ClickHouse has no DDL transactions, so a
// file that failed half-way is re-run from its first statement.
func Migrate(ctx context.Context, conn Conn, migs []Migration, log *slog.Logger) ([]Migration, error) {
	return MigrateSchema(ctx, conn, Schema{}, migs, log)
}

// MigrateSchema is Migrate for schema s: on a cluster the migrations are
// translated by s.ForCluster and applied ON CLUSTER, and recorded in a
// migrations table every server shares. A database migrated for the other
// kind of schema is refused, naming clickhouse.cluster.
func MigrateSchema(ctx context.Context, conn Conn, s Schema, migs []Migration, log *slog.Logger) ([]Migration, error) {
	migs, err := s.ForCluster(migs)
	if err != nil {
		return nil, err
	}
	applied, err := appliedMigrations(ctx, conn, s)
	if err != nil {
		return nil, err
	}
	var done []Migration
	for _, m := range migs {
		if a, ok := applied[m.Version]; ok {
			if a.Checksum != m.Checksum {
				return done, &MigrationError{File: m.File, Err: fmt.Errorf("%w: applied %s as %s", ErrChecksumMismatch, a.At.Format(time.RFC3339), a.File)}
			}
			continue
		}
		began := time.Now()
		for i, stmt := range m.Statements {
			src, n := m.source(i)
			if err := execMigration(ctx, conn, s, stmt, src); err != nil {
				if columnsAlreadyAdded(src, err) {
					if s.Cluster == "" {
						log.Info("migration statement already applied: its columns exist", "file", m.File, "statement", n)
						continue
					}
					// ON CLUSTER answers with the first host's error: another
					// host's ALTER may have failed.
					ok, verr := columnsOnEveryHost(ctx, conn, s, stmt, src)
					if ok {
						log.Info("migration statement already applied: its columns exist on every host", "file", m.File, "statement", n)
						continue
					}
					if verr != nil {
						log.Warn("migration statement already applied on some host; its columns could not be checked on every host: applied", "file", m.File, "statement", n, "err", verr)
						continue
					}
					err = fmt.Errorf("%w (%w)", err, errColumnsNotOnEveryHost)
				} else if s.Cluster != "" && addColumnsOnly.MatchString(strings.TrimSpace(src)) {
					if ok, verr := columnsOnEveryHost(ctx, conn, s, stmt, src); ok {
						log.Warn("ALTER ON CLUSTER unfinished on some host, but every host has the columns: applied", "file", m.File, "statement", n, "err", err)
						continue
					} else if verr != nil {
						err = fmt.Errorf("%w (checking the columns on every host: %v)", err, verr)
					}
				}
				if m.sources != nil {
					err = fmt.Errorf("%w (cluster statement: %s)", err, firstLine(stmt))
				}
				return done, &MigrationError{File: m.File, Statement: n, Err: err}
			}
		}
		if err := record(ctx, conn, m); err != nil {
			return done, &MigrationError{File: m.File, Err: fmt.Errorf("record in %s: %w", MigrationsTable, err)}
		}
		log.Info("migration applied", "file", m.File, "statements", len(m.Statements), "took", time.Since(began).Round(time.Millisecond))
		done = append(done, m)
	}
	return done, nil
}

// firstLine is the first line of s, for error messages.
func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " …"
	}
	return s
}

// addColumnsOnly matches an ALTER TABLE whose every clause is ADD COLUMN.
var addColumnsOnly = regexp.MustCompile(`(?is)^ALTER\s+TABLE\s+[^\s]+\s+ADD\s+COLUMN\s+[^,]+(,\s*ADD\s+COLUMN\s+[^,]+)*$`)

// ddlTimeout bounds how long an ALTER ON CLUSTER waits for every host's
// answer. ClickHouse 18.16's DDL worker can leave one replica of a shard
// without an answer (two replicas both run a replicated ALTER and the
// second fails to record it: "Node exists … /executed"), and the server's
// default wait is 180 s; the columns are then checked on every host instead
// (columnsOnEveryHost).
const ddlTimeout = 30

// execMigration runs one migration statement; an ALTER that only adds
// columns on a cluster waits at most ddlTimeout seconds for the hosts.
func execMigration(ctx context.Context, conn Conn, s Schema, stmt, src string) error {
	// No query_timeout: the pool's max_execution_time (60 s by default)
	// cut a migration's INSERT … SELECT copying the existing history
	// (0004, 0005: minutes over billions of rows) at 60 s, code 159, which
	// SetupWait retried for ever from the first statement — every role
	// needing ClickHouse never ready after an upgrade. A start context
	// with a deadline still bounds it (the driver sets max_execution_time
	// from the deadline).
	settings := ch.Settings{"max_execution_time": 0}
	if s.Cluster != "" && addColumnsOnly.MatchString(strings.TrimSpace(src)) {
		settings["distributed_ddl_task_timeout"] = ddlTimeout
	}
	return conn.Exec(ch.Context(ctx, ch.WithSettings(settings)), stmt)
}

var (
	alterTable = regexp.MustCompile(`(?is)^ALTER\s+TABLE\s+(?:[^\s.]+\.)?([^\s.]+)\s`)
	addColumn  = regexp.MustCompile(`(?is)ADD\s+COLUMN\s+(?:IF\s+NOT\s+EXISTS\s+)?([^\s,]+)`)
)

// columnsOnEveryHost reports whether every host of the schema's cluster
// has the columns the cluster ALTER stmt (translated from src) adds,
// asking each host's system.columns through remote() (as the server's
// default user; false with the error when a host cannot be asked).
func columnsOnEveryHost(ctx context.Context, conn Conn, s Schema, stmt, src string) (bool, error) {
	tm := alterTable.FindStringSubmatch(strings.TrimSpace(stmt))
	if tm == nil {
		return false, fmt.Errorf("no table in %q", firstLine(stmt))
	}
	var cols []string
	for _, m := range addColumn.FindAllStringSubmatch(src, -1) {
		cols = append(cols, strings.Trim(m[1], "`\""))
	}
	rows, err := conn.Query(ctx, "SELECT host_address, toUInt32(port) FROM system.clusters WHERE cluster = ?", s.Cluster)
	if err != nil {
		return false, err
	}
	var hosts []string
	for rows.Next() {
		var addr string
		var port uint32
		if err := rows.Scan(&addr, &port); err != nil {
			rows.Close()
			return false, err
		}
		hosts = append(hosts, fmt.Sprintf("%s:%d", addr, port))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return false, err
	}
	if len(hosts) == 0 {
		return false, fmt.Errorf("cluster %s: no hosts in system.clusters", s.Cluster)
	}
	for _, h := range hosts {
		var n uint64
		q := "SELECT count() FROM remote(?, system.columns) WHERE database = ? AND table = ? AND has(?, name)"
		if err := conn.QueryRow(ctx, q, h, s.Database, tm[1], cols).Scan(&n); err != nil {
			return false, fmt.Errorf("host %s: %w", h, err)
		}
		if n != uint64(len(cols)) {
			return false, nil
		}
	}
	return true, nil
}

// columnsAlreadyAdded reports whether err is ClickHouse refusing an ALTER
// TABLE that only adds columns because they exist — code 44 on 18.16
// (ILLEGAL_COLUMN), 15 on current ClickHouse (DUPLICATE_COLUMN), "column
// with this name already exists" on both: the statement ran before (a file
// that failed after it, or whose record was lost). ClickHouse 18.16 has no
// ADD COLUMN IF NOT EXISTS; one ALTER adding several columns is applied
// whole or not at all, so a migration adds its columns in one such
// statement and stays idempotent.
func columnsAlreadyAdded(stmt string, err error) bool {
	var ex *ch.Exception
	return errors.As(err, &ex) && (ex.Code == 44 || ex.Code == 15) && strings.Contains(ex.Message, "already exists") &&
		addColumnsOnly.MatchString(strings.TrimSpace(stmt))
}

// record inserts m into the migrations table.
func record(ctx context.Context, conn Conn, m Migration) error {
	b, err := conn.PrepareBatch(ctx, `INSERT INTO `+MigrationsTable+` (version, file, checksum, applied)`)
	if err != nil {
		return err
	}
	defer b.Close()
	if err := b.Append(m.Version, m.File, m.Checksum, time.Now().UTC().Truncate(time.Second)); err != nil {
		return err
	}
	return b.Send()
}

// Setup is what a binary that needs ClickHouse does at start: create the
// database, open it, and apply faultline's migrations (sql/migrations),
// ON CLUSTER when clickhouse.cluster is set.
// A failed migration stops start-up with a *MigrationError.
func Setup(ctx context.Context, c Config, log *slog.Logger) (Conn, error) {
	return SetupFS(ctx, c, sql.Migrations, "migrations", log)
}

// SetupWait is Setup for a role that must not start without ClickHouse:
// while the server is unreachable it retries, backing off from 200ms to
// 5s and logging each failure — also when a migration statement fails
// because the connection was lost or timed out (MigrationError.Transient:
// the server restarted mid-file, an ON CLUSTER ALTER outlived its wait, a
// lagging host lacks the columns of a rerun one);
// a migration the server refuses, a bad or changed file, a database
// migrated for the other kind of schema, or the end of ctx stops it with
// the error. A refused login (a password rotation may be under way) and a
// clickhouse.cluster the server does not know (its definition may still be
// on its way) are retried but logged at ERROR, the latter naming
// clickhouse.cluster.
func SetupWait(ctx context.Context, c Config, log *slog.Logger) (Conn, error) {
	return setupWait(ctx, c, log, func(ctx context.Context) (Conn, error) { return Setup(ctx, c, log) })
}

// configError is a configuration the server cannot serve: retrying does
// not cure it, so SetupWait stops with it.
type configError struct{ error }

func (e configError) Unwrap() error { return e.error }

// unknownClusterCodes are how a server refuses an ON CLUSTER statement
// naming a cluster not in its remote_servers: BAD_GET on 18.16 (a
// catch-all there), CLUSTER_DOESNT_EXIST on current ClickHouse. It is
// retried: during a joint rollout the cluster's definition may not have
// reached the server yet, or one server behind clickhouse.addr not have
// reloaded it.
var unknownClusterCodes = map[int32]bool{170: true, 701: true}

// authCodes are ClickHouse's refused logins: UNKNOWN_USER and
// WRONG_PASSWORD (18.16), AUTHENTICATION_FAILED (current).
var authCodes = map[int32]bool{192: true, 193: true, 516: true}

// setupWait is SetupWait with Setup replaced by setup.
func setupWait(ctx context.Context, c Config, log *slog.Logger, setup func(context.Context) (Conn, error)) (Conn, error) {
	backoff := 200 * time.Millisecond
	for {
		conn, err := setup(ctx)
		if err == nil {
			return conn, nil
		}
		if me, bad := errors.AsType[*MigrationError](err); bad && !me.Transient() {
			return nil, err
		}
		if _, bad := errors.AsType[configError](err); bad {
			return nil, err
		}
		level, attrs := slog.LevelWarn, []any{"addr", c.Addr, "backoff", backoff, "err", err}
		if ex, ok := errors.AsType[*ch.Exception](err); ok {
			switch {
			case unknownClusterCodes[ex.Code]:
				level, attrs = slog.LevelError, append(attrs, "clickhouse.cluster", c.Cluster)
			case authCodes[ex.Code]:
				level = slog.LevelError
			}
		}
		log.Log(ctx, level, "clickhouse not ready; retrying", attrs...)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("clickhouse %s not ready: %w", c, err)
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// SetupFS is Setup with the migrations read from dir of fsys.
func SetupFS(ctx context.Context, c Config, fsys fs.FS, dir string, log *slog.Logger) (Conn, error) {
	migs, err := LoadMigrations(fsys, dir)
	if err != nil {
		return nil, err
	}
	if err := EnsureDatabase(ctx, c, log); err != nil {
		return nil, err
	}
	conn, err := Open(ctx, c, log)
	if err != nil {
		return nil, err
	}
	if v, err := conn.ServerVersion(); err == nil {
		log.Info("clickhouse connected", "addr", c.Addr, "database", c.Database, "server_version", v.String())
	}
	if _, err := MigrateSchema(ctx, conn, c.Schema(), migs, log); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}
