-- Fleet page: a cluster's circuit breaker (the latest breaker_open or
-- breaker_close action: open, closed, or never tripped) and whether its
-- quarantines are dry-run (the latest quarantine decision was), both as
-- of now, and how many nodes reported events received in [since, until)
-- (read from recent_events, partitioned by day: only the range's days are
-- read; it keeps the last 8 days). since and until bound the reporting
-- nodes only, as in state_counts. Times are Unix milliseconds.
-- param: cluster String ''     the cluster
-- param: now DateTime now       the breaker and dry-run as of this time
-- param: since DateTime now-1d  nodes reporting at or after this time
-- param: until DateTime now     ...and before this time
SELECT
    breaker_kind,
    toUInt64(breaker_at) AS breaker_since_ms,
    breaker_reason,
    dry_run,
    toUInt64(decisions) AS decisions,
    toUInt64(ifNull((
        SELECT uniqExact(node)
        FROM recent_events
        WHERE received >= @since AND received < @until AND cluster = @cluster
    ), 0)) AS reporting_nodes
FROM
(
    SELECT
        argMaxIf(kind, t, kind IN ('breaker_open', 'breaker_close')) AS breaker_kind,
        maxIf(t, kind IN ('breaker_open', 'breaker_close')) AS breaker_at,
        argMaxIf(reason, t, kind IN ('breaker_open', 'breaker_close')) AS breaker_reason,
        argMaxIf(dry_run, t, kind = 'quarantine') AS dry_run,
        countIf(kind = 'quarantine') AS decisions -- only compared with 0: duplicates do not matter
    FROM
    (
        SELECT id, kind, reason, dry_run, toUInt64(ts) * 1000 + ts_ms AS t
        FROM actions
        WHERE cluster = @cluster AND role = 'quarantine' AND ts <= @now
    )
)
