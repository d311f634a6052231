-- Fleet page: the nodes of a cluster that the conformance role last found
-- drifted from their conformance group (its latest conformance_drift or
-- conformance_restored action is a drift, applied or decided in dry-run),
-- with what differs. Times are Unix milliseconds.
-- param: cluster String ''   the cluster
-- param: now DateTime now    the state as of this time
SELECT node, toUInt64(at) AS drifted_since_ms, differing
FROM
(
    SELECT node, max(t) AS at, argMax(kind, t) AS last, argMax(differing, t) AS differing
    FROM
    (
        SELECT node, kind, toUInt64(ts) * 1000 + ts_ms AS t,
            details.value[indexOf(details.key, 'differing')] AS differing
        FROM actions
        WHERE cluster = @cluster AND ts <= @now AND kind IN ('conformance_drift', 'conformance_restored')
    )
    GROUP BY node
    HAVING last = 'conformance_drift'
)
ORDER BY node
