-- FabricIncident: how many distinct nodes of one cluster reported the same
-- fault (gkey = the signature "checkName|firstErrorCode") unhealthy in
-- (at - window, at].
-- param: checks Array(String)  checks whose faults can be fabric-wide
SELECT
    tid,
    toFloat64(uniqExact(n)) AS value,
    arraySlice(arraySort(groupUniqArray(id)), 1, 100) AS cause_ids,
    max(t) AS last_ms
FROM (SELECT tid, cityHash64(cluster, gkey) AS gh, at_ms FROM triggers)
ALL INNER JOIN
(
    SELECT gh, n, id, t
    FROM
    (
        SELECT cityHash64(cluster, concat(check, '|', error_codes[1])) AS gh, cityHash64(node) AS n, id, toUInt64(ts) * 1000 + ts_ms AS t
        FROM recent_events
        PREWHERE check IN (SELECT arrayJoin(@checks)) AND ts >= @since AND ts <= @until
        WHERE cluster IN (SELECT cluster FROM triggers) AND is_healthy = 0
        UNION ALL
        SELECT cityHash64(cluster, concat(check, '|', error_codes[1])) AS gh, cityHash64(node) AS n, id, toUInt64(ts) * 1000 + ts_ms AS t
        FROM batch
        WHERE has(@checks, check) AND is_healthy = 0
            AND derived_by = '' AND processing_strategy != 'STORE_ONLY'
    )
    LIMIT 1 BY id
) USING (gh)
WHERE t > at_ms - @window_ms AND t <= at_ms
GROUP BY tid
