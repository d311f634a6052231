-- Mean time between fatal faults per node: (last - first) / (fatal events - 1)
-- over the raw fatal events of the range, for nodes with at least two;
-- shortest (worst) first.
-- param: since DateTime now-30d  events generated at or after this time
-- param: until DateTime now      ...and before this time
-- param: cluster String ''       only this cluster ('' for all)
-- param: limit UInt64 50         at most this many nodes
SELECT
    cluster,
    node,
    count() AS fatal_events,
    min(ts) AS first_fatal,
    max(ts) AS last_fatal,
    intDiv(toUInt32(max(ts)) - toUInt32(min(ts)), count() - 1) AS mtbf_seconds
FROM
(
    SELECT cluster, node, id, ts
    FROM events
    WHERE ts >= @since AND ts < @until AND (@cluster = '' OR cluster = @cluster)
        AND is_fatal = 1 AND derived_by = ''
    LIMIT 1 BY id
)
GROUP BY cluster, node
HAVING count() >= 2
ORDER BY mtbf_seconds, cluster, node
LIMIT @limit
