-- Fleet page: the nodes of a cluster whose latest conformance drift event
-- (check drift_check, raw or derived) is unhealthy: their configuration
-- differs from their group's. Times are Unix milliseconds.
-- param: cluster String ''                 the cluster
-- param: drift_check String 'ConformanceDrift'  the check that reports drift
-- param: now DateTime now                  the state as of this time
SELECT node, toUInt64(at) AS drifted_since_ms, message
FROM
(
    SELECT node, max(t) AS at, argMax(is_healthy, t) AS healthy, argMax(message, t) AS message
    FROM
    (
        SELECT node, id, is_healthy, message, toUInt64(ts) * 1000 + ts_ms AS t
        FROM events
        WHERE cluster = @cluster AND check = @drift_check AND ts <= @now
        LIMIT 1 BY id
    )
    GROUP BY node
    HAVING healthy = 0
)
ORDER BY node
