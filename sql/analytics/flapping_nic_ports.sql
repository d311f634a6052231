-- NIC ports that flap: ports (events with a NICPort entity) that went down
-- (unhealthy events) at least min_downs times and came back (healthy events)
-- at least once in the range. Each event counted once.
-- param: since DateTime now-1d  events generated at or after this time
-- param: until DateTime now     ...and before this time
-- param: cluster String ''      only this cluster ('' for all)
-- param: min_downs UInt64 3     at least this many down events
-- param: limit UInt64 50        at most this many ports
SELECT cluster, node, entity AS port, downs, ups, first_down, last_down
FROM
(
    SELECT
        cluster,
        node,
        entity,
        countIf(is_healthy = 0) AS downs,
        countIf(is_healthy = 1) AS ups,
        minIf(ts, is_healthy = 0) AS first_down,
        maxIf(ts, is_healthy = 0) AS last_down
    FROM
    (
        SELECT cluster, node, entity, id, is_healthy, ts
        FROM events
        WHERE ts >= @since AND ts < @until AND (@cluster = '' OR cluster = @cluster)
            AND has(entities.type, 'NICPort') AND derived_by = ''
        LIMIT 1 BY id
    )
    GROUP BY cluster, node, entity
)
WHERE downs >= @min_downs AND ups >= 1
ORDER BY downs DESC, cluster, node, port
LIMIT @limit
