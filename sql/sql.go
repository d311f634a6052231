// Package sql embeds faultline's ClickHouse SQL: the versioned schema
// migrations (migrations/NNNN_name.sql, applied in order by
// internal/clickhouse) and the named analytics queries (analytics/NAME.sql,
// run by `faultline query NAME`) and the fleet page's queries
// (fleet/NAME.sql, run by internal/fleet). See README.md for the versions of
// ClickHouse this SQL supports.
package sql

import "embed"

// Migrations holds migrations/*.sql.
//
//go:embed migrations/*.sql
var Migrations embed.FS

// Analytics holds analytics/*.sql.
//
//go:embed analytics/*.sql
var Analytics embed.FS

// Fleet holds fleet/*.sql: the fleet page's queries (internal/fleet), in
// the analytics header format.
//
//go:embed fleet/*.sql
var Fleet embed.FS
