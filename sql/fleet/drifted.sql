-- Fleet page: the nodes of a cluster whose latest conformance drift report
-- (check drift_check) is unhealthy: their configuration differs from their
-- group's. Read from recent_events (ordered by check, then time, so only
-- the drift reports of the last 8 days are read: the table keeps 8 days, and
-- conformance reports recur well within that). entity names what drifted. Times are
-- Unix milliseconds.
-- param: cluster String ''                      the cluster
-- param: drift_check String 'ConformanceDrift'  the check that reports drift
-- param: now DateTime now                       the state as of this time
SELECT node, toUInt64(at) AS drifted_since_ms, entity
FROM
(
    SELECT node, max(t) AS at, argMax(is_healthy, t) AS healthy, argMax(entity, t) AS entity
    FROM
    (
        SELECT node, id, is_healthy, entity, toUInt64(ts) * 1000 + ts_ms AS t
        FROM recent_events
        WHERE check = @drift_check AND ts <= @now AND ts > @now - 691200 AND cluster = @cluster
    )
    GROUP BY node
    HAVING healthy = 0
)
ORDER BY node
