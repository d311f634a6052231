-- Events per cluster, node and day (raw and derived), each event counted once.
-- param: since DateTime now-7d  events generated at or after this time
-- param: until DateTime now     ...and before this time
-- param: cluster String ''      only this cluster ('' for all)
SELECT
    cluster,
    node,
    toDate(ts) AS day,
    uniqExact(id) AS events,
    uniqExactIf(id, is_fatal = 1) AS fatal,
    uniqExactIf(id, is_healthy = 0) AS unhealthy,
    uniqExactIf(id, derived_by != '') AS derived
FROM events
WHERE ts >= @since AND ts < @until AND (@cluster = '' OR cluster = @cluster)
GROUP BY cluster, node, day
ORDER BY cluster, node, day
