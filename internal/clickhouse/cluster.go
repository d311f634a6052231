package clickhouse

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// The cluster schema.
//
// sql/migrations holds one schema, written for a single server. For a
// cluster (clickhouse.cluster set) the same files are applied through a
// fixed translation, statement by statement, so the two schemas cannot
// drift: every table T of the files becomes
//
//   - T_local, created ON CLUSTER with the Replicated variant of T's engine
//     (same columns, partitioning, sorting key and settings), holding one
//     shard's rows, and
//   - T, a Distributed table over T_local, sharded by
//     cityHash64(cluster, node): a node's events (and every copy a store
//     retry writes) live on one shard, so ReplacingMergeTree merges and
//     every query's LIMIT 1 BY id / uniqExact(id) deduplicate exactly as on
//     one server.
//
// So every query and insert of faultline names T unchanged and goes
// through the Distributed table. A materialized view reads T_local and
// writes T'_local on the shard where the rows land (each shard copies its
// own rows). An ALTER that changes columns is applied to T_local ON
// CLUSTER, then T is dropped and created again over the new T_local
// (ClickHouse 18.16 refuses ALTER ON CLUSTER of a Distributed table when
// the cluster's shards use internal_replication). INSERT … SELECT
// statements run as written, through the Distributed tables. A statement
// of another shape stops with an error naming it: the translation is
// extended, never guessed.

// LocalSuffix is appended to a table's name for the table that holds a
// shard's rows in a cluster.
const LocalSuffix = "_local"

// ShardingKey is the sharding expression of every Distributed table.
const ShardingKey = "cityHash64(cluster, node)"

// DefaultZooKeeperPath is the default ZooKeeper path of a replicated
// table: {shard} and {replica} are the servers' macros, {database} and
// {table} are filled in by faultline (ClickHouse 18.16 has no such macros).
const DefaultZooKeeperPath = "/clickhouse/tables/{shard}/{database}/{table}"

// DefaultReplicaName is the default replica name of a replicated table.
const DefaultReplicaName = "{replica}"

// Schema is how migrations are applied: to one server (Cluster "") or ON
// CLUSTER to the servers of Cluster.
type Schema struct {
	// Cluster is the remote_servers cluster name; "" for one server.
	Cluster string
	// Database holds the tables.
	Database string
	// ZooKeeperPath of each replicated table, with {database} and {table}
	// filled in here and the servers' macros ({shard}) by ClickHouse.
	ZooKeeperPath string
	// ReplicaName of each replica, usually the {replica} macro.
	ReplicaName string
}

// Schema returns the schema the config asks for.
func (c Config) Schema() Schema {
	return Schema{Cluster: c.Cluster, Database: c.Database, ZooKeeperPath: c.ZooKeeperPath, ReplicaName: c.ReplicaName}
}

// Clustered reports whether the schema is applied ON CLUSTER.
func (s Schema) Clustered() bool { return s.Cluster != "" }

func (s Schema) onCluster() string { return onClusterClause(s.Cluster) }

// onClusterClause is " ON CLUSTER 'name'": quoted, since a bare name with
// a '-' (allowed in a cluster name) is a syntax error; Validate keeps
// quotes out of the name.
func onClusterClause(name string) string { return " ON CLUSTER '" + name + "'" }

func (s Schema) qualified(table string) string { return s.Database + "." + table }

// zkPath is the ZooKeeper path of table.
func (s Schema) zkPath(table string) string {
	return strings.NewReplacer("{database}", s.Database, "{table}", table).Replace(s.ZooKeeperPath)
}

// migrationsTableDDL creates the migrations table: on a cluster, one
// replicated table with a replica on every server of every shard (its path
// is the tables' path with {shard} replaced by "all", and the replica name
// is prefixed with the shard), so every server sees which files ran.
func (s Schema) migrationsTableDDL() string {
	cols := `(version UInt32, file String, checksum String, applied DateTime)`
	if !s.Clustered() {
		return `CREATE TABLE IF NOT EXISTS ` + MigrationsTable + ` ` + cols + ` ENGINE = ReplacingMergeTree() ORDER BY version`
	}
	path := strings.ReplaceAll(s.zkPath(MigrationsTable), "{shard}", "all")
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s%s %s ENGINE = ReplicatedReplacingMergeTree('%s', '{shard}-%s') ORDER BY version`,
		s.qualified(MigrationsTable), s.onCluster(), cols, path, s.ReplicaName)
}

// checkMode refuses a database whose migrations table was made for the
// other kind of schema: a single-server database cannot be turned into a
// cluster by setting clickhouse.cluster, nor read as one without it. The
// refusal is a configError: SetupWait stops with it.
func (s Schema) checkMode(ctx context.Context, conn Conn) error {
	var engine string
	if err := conn.QueryRow(ctx, `SELECT engine FROM system.tables WHERE database = ? AND name = ?`, s.Database, MigrationsTable).Scan(&engine); err != nil {
		return fmt.Errorf("read the engine of %s.%s: %w", s.Database, MigrationsTable, err)
	}
	replicated := strings.HasPrefix(engine, "Replicated")
	switch {
	case s.Clustered() && !replicated:
		return configError{fmt.Errorf("clickhouse.cluster: database %s was migrated for a single server (%s is %s); a cluster schema needs a new database (set clickhouse.database) and a copy of the data", s.Database, MigrationsTable, engine)}
	case !s.Clustered() && replicated:
		return configError{fmt.Errorf("clickhouse.cluster: database %s was migrated ON CLUSTER (%s is %s); set clickhouse.cluster to its cluster name", s.Database, MigrationsTable, engine)}
	}
	return nil
}

var (
	createTableRE = regexp.MustCompile(`(?is)^CREATE\s+TABLE\s+IF\s+NOT\s+EXISTS\s+([A-Za-z_][A-Za-z0-9_]*)\s*(\(.*\))\s*ENGINE\s*=\s*([A-Za-z]*MergeTree)\s*\(([^)]*)\)(.*)$`)
	createViewRE  = regexp.MustCompile(`(?is)^CREATE\s+MATERIALIZED\s+VIEW\s+IF\s+NOT\s+EXISTS\s+([A-Za-z_][A-Za-z0-9_]*)\s+TO\s+([A-Za-z_][A-Za-z0-9_]*)\s+AS\s+(SELECT\s.*)$`)
	fromRE        = regexp.MustCompile(`(?i)\bFROM\s+([A-Za-z_][A-Za-z0-9_.]*)`)
	alterRE       = regexp.MustCompile(`(?is)^ALTER\s+TABLE\s+([A-Za-z_][A-Za-z0-9_]*)\s+(.*)$`)
	columnsAltRE  = regexp.MustCompile(`(?is)^(ADD|DROP|MODIFY)\s+COLUMN\s+[^,]+(,\s*(ADD|DROP|MODIFY)\s+COLUMN\s+[^,]+)*$`)
	insertRE      = regexp.MustCompile(`(?is)^INSERT\s+INTO\s+[A-Za-z_][A-Za-z0-9_]*\s*\([^)]*\)\s*SELECT\s`)
	clusterColRE  = regexp.MustCompile(`(?m)(^|[(,\s])cluster\s+String\b`)
	nodeColRE     = regexp.MustCompile(`(?m)(^|[(,\s])node\s+String\b`)
)

// ForCluster returns the migrations as they are applied ON CLUSTER (see
// the translation above); checksums stay those of the files. A statement
// the translation does not know is an error naming the file and statement.
// For a single-server schema it returns migs unchanged.
func (s Schema) ForCluster(migs []Migration) ([]Migration, error) {
	if !s.Clustered() {
		return migs, nil
	}
	tables := map[string]bool{}
	out := make([]Migration, len(migs))
	for mi, m := range migs {
		cm := m
		cm.Statements, cm.sources, cm.sourceIndex = nil, nil, nil
		for i, stmt := range m.Statements {
			stmts, err := s.translate(stmt, tables)
			if err != nil {
				return nil, &MigrationError{File: m.File, Statement: i + 1, Err: fmt.Errorf("cluster schema: %w", err)}
			}
			for _, cs := range stmts {
				cm.Statements = append(cm.Statements, cs)
				cm.sources = append(cm.sources, stmt)
				cm.sourceIndex = append(cm.sourceIndex, i+1)
			}
		}
		out[mi] = cm
	}
	return out, nil
}

// translate returns the cluster statements of one single-server statement;
// tables collects the tables created so far.
func (s Schema) translate(stmt string, tables map[string]bool) ([]string, error) {
	stmt = dropBlankLines(strings.TrimSpace(stmt))
	if m := createTableRE.FindStringSubmatch(stmt); m != nil {
		name, cols, engine, args, rest := m[1], m[2], m[3], strings.TrimSpace(m[4]), m[5]
		if !clusterColRE.MatchString(cols) || !nodeColRE.MatchString(cols) {
			return nil, fmt.Errorf("table %s has no cluster and node String columns to shard by (%s)", name, ShardingKey)
		}
		local := name + LocalSuffix
		repArgs := fmt.Sprintf("'%s', '%s'", s.zkPath(local), s.ReplicaName)
		if args != "" {
			repArgs += ", " + args
		}
		tables[name] = true
		return []string{
			fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s%s\n%s\nENGINE = Replicated%s(%s)%s", s.qualified(local), s.onCluster(), cols, engine, repArgs, rest),
			s.distributedDDL(name),
		}, nil
	}
	if m := createViewRE.FindStringSubmatch(stmt); m != nil {
		view, to, sel := m[1], m[2], m[3]
		if !tables[to] {
			return nil, fmt.Errorf("materialized view %s writes to %s, which no earlier migration creates", view, to)
		}
		var bad error
		n := 0
		sel = fromRE.ReplaceAllStringFunc(sel, func(f string) string {
			src := fromRE.FindStringSubmatch(f)[1]
			if !tables[src] {
				bad = fmt.Errorf("materialized view %s reads %s, which no earlier migration creates", view, src)
				return f
			}
			n++
			return "FROM " + s.qualified(src+LocalSuffix)
		})
		if bad != nil {
			return nil, bad
		}
		if n == 0 {
			return nil, fmt.Errorf("materialized view %s: no FROM table found", view)
		}
		return []string{fmt.Sprintf("CREATE MATERIALIZED VIEW IF NOT EXISTS %s%s TO %s AS %s",
			s.qualified(view), s.onCluster(), s.qualified(to+LocalSuffix), sel)}, nil
	}
	if m := alterRE.FindStringSubmatch(stmt); m != nil {
		table, clauses := m[1], strings.TrimSpace(m[2])
		if !tables[table] {
			return nil, fmt.Errorf("ALTER of %s, which no earlier migration creates", table)
		}
		if !columnsAltRE.MatchString(clauses) {
			return nil, fmt.Errorf("ALTER TABLE %s: only ADD, DROP and MODIFY COLUMN clauses are translated", table)
		}
		return []string{
			fmt.Sprintf("ALTER TABLE %s%s %s", s.qualified(table+LocalSuffix), s.onCluster(), clauses),
			fmt.Sprintf("DROP TABLE IF EXISTS %s%s", s.qualified(table), s.onCluster()),
			s.distributedDDL(table),
		}, nil
	}
	if insertRE.MatchString(stmt) {
		return []string{stmt}, nil
	}
	return nil, errors.New("only CREATE TABLE IF NOT EXISTS … ENGINE = *MergeTree, CREATE MATERIALIZED VIEW IF NOT EXISTS … TO …, " +
		"ALTER TABLE … ADD/DROP/MODIFY COLUMN and INSERT INTO … SELECT are translated to a cluster; extend internal/clickhouse/cluster.go")
}

// dropBlankLines removes the blank lines SplitStatements leaves where
// comments were.
func dropBlankLines(s string) string {
	lines := strings.Split(s, "\n")
	out := lines[:0]
	for _, l := range lines {
		if strings.TrimSpace(l) != "" {
			out = append(out, strings.TrimRight(l, " \t"))
		}
	}
	return strings.Join(out, "\n")
}

// distributedDDL creates the Distributed table name over its local table.
func (s Schema) distributedDDL(name string) string {
	return fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s%s AS %s ENGINE = Distributed('%s', %s, %s, %s)",
		s.qualified(name), s.onCluster(), s.qualified(name+LocalSuffix), s.Cluster, s.Database, name+LocalSuffix, ShardingKey)
}

// distributedRE reads Distributed(cluster, database, table, …) from
// system.tables.engine_full (18.16 prints bare names, current servers
// quoted ones).
var distributedRE = regexp.MustCompile(`^Distributed\(\s*'?([A-Za-z0-9_.-]+)'?\s*,\s*'?([A-Za-z0-9_]*)'?\s*,\s*'?([A-Za-z0-9_]+)'?`)

// distributedTarget returns the cluster and local table of database.table
// when it is a Distributed table, ok false when it is not.
func distributedTarget(ctx context.Context, conn Conn, database, table string) (cluster, local string, ok bool, err error) {
	var engine, full string
	err = conn.QueryRow(ctx, `SELECT engine, engine_full FROM system.tables WHERE database = ? AND name = ?`, database, table).Scan(&engine, &full)
	if err != nil {
		return "", "", false, fmt.Errorf("read the engine of %s.%s: %w", database, table, err)
	}
	if engine != "Distributed" {
		return "", "", false, nil
	}
	m := distributedRE.FindStringSubmatch(full)
	if m == nil {
		return "", "", false, fmt.Errorf("%s.%s: cannot read the cluster and table of %q", database, table, full)
	}
	return m[1], m[3], true, nil
}
