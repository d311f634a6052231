package clickhouse

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"
)

// RetainedTables are the tables whose partitions retention drops; all are
// partitioned by toYYYYMM(received).
var RetainedTables = []string{"events", "derived_events", "actions", "conformance"}

// RecentRetention is how long the day-partitioned working tables keep
// rows, whatever the history's retention: longer than any correlation
// window (the longest events window is 24h plus the 3h sticky Xid horizon).
const RecentRetention = 8 * 24 * time.Hour

// RecentTables are partitioned by toYYYYMMDD(received) and kept
// RecentRetention (DropOlderThan handles day partitions too).
var RecentTables = []string{"recent_events"}

// DropOlderThan drops the monthly (YYYYMM) or daily (YYYYMMDD) partitions
// of table whose every row was received more than age before now: a
// partition goes once the start of the next month (day) is at or before
// now-age, so up to a month (day) more than age is kept. It returns the
// partitions dropped. When table is Distributed (a cluster schema), the
// partitions of its local table on every server are listed and dropped ON
// CLUSTER (a replicated table drops a partition on every replica).
func DropOlderThan(ctx context.Context, conn Conn, database, table string, age time.Duration, now time.Time, log *slog.Logger) ([]string, error) {
	cutoff := now.UTC().Add(-age)
	partsTable := "system.parts"
	onCluster := ""
	if cluster, local, ok, err := distributedTarget(ctx, conn, database, table); err != nil {
		return nil, err
	} else if ok {
		// The cluster name was read by distributedRE (letters, digits,
		// '_', '.', '-'): no quote to escape.
		partsTable = fmt.Sprintf("cluster('%s', system, parts)", cluster)
		onCluster = onClusterClause(cluster)
		table = local
	}
	rows, err := conn.Query(ctx, `SELECT DISTINCT partition FROM `+partsTable+`
		WHERE database = ? AND table = ? AND active ORDER BY partition`, database, table)
	if err != nil {
		return nil, fmt.Errorf("list partitions of %s.%s: %w", database, table, err)
	}
	var parts []string
	for rows.Next() {
		var p string
		if err := rows.Scan(&p); err != nil {
			rows.Close()
			return nil, fmt.Errorf("list partitions of %s.%s: %w", database, table, err)
		}
		parts = append(parts, p)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list partitions of %s.%s: %w", database, table, err)
	}
	var dropped []string
	for _, p := range parts {
		ym, err := strconv.Atoi(p)
		var next time.Time
		switch {
		case err == nil && len(p) == 6 && ym >= 100001:
			next = time.Date(ym/100, time.Month(ym%100)+1, 1, 0, 0, 0, 0, time.UTC)
		case err == nil && len(p) == 8 && ym >= 10000101:
			next = time.Date(ym/10000, time.Month(ym/100%100), ym%100+1, 0, 0, 0, 0, time.UTC)
		default:
			log.Warn("retention: partition is not YYYYMM or YYYYMMDD; left alone", "table", table, "partition", p)
			continue
		}
		if next.After(cutoff) {
			continue
		}
		// The partition id is a number we just parsed: nothing to escape.
		if err := conn.Exec(ctx, fmt.Sprintf("ALTER TABLE %s.%s%s DROP PARTITION %d", database, table, onCluster, ym)); err != nil {
			return dropped, fmt.Errorf("drop partition %d of %s.%s: %w", ym, database, table, err)
		}
		log.Info("retention: partition dropped", "table", table, "partition", ym, "max_age", age)
		dropped = append(dropped, p)
	}
	return dropped, nil
}
