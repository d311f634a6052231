package sql

import "embed"

// Rules holds rules/*.sql, the window queries of the correlation rules
// (processors/correlate), named by the rules file's `query` and
// `candidates` keys.
//
//go:embed rules/*.sql
var Rules embed.FS
