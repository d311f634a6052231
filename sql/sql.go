// Package sql embeds faultline's ClickHouse SQL: the versioned schema
// migrations (migrations/NNNN_name.sql, applied in order by
// internal/clickhouse) and the named analytics queries (analytics/NAME.sql,
// run by `faultline query NAME`). See README.md for the versions of
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
