-- MultipleRemediations: remediation actions on one node (scope node, gkey '')
-- in (at - window, at], from the actions table and the batch's actions.
-- param: kinds Array(String)     action kinds that are remediations
-- param: outcomes Array(String)  outcomes that mean it was done
SELECT
    tid,
    toFloat64(count()) AS value,
    arraySlice(arraySort(groupUniqArray(id)), 1, 100) AS cause_ids,
    max(t) AS last_ms
FROM (SELECT tid, cityHash64(cluster, node) AS gh, at_ms FROM triggers) AS tr
ALL INNER JOIN
(
    SELECT gh, id, t
    FROM
    (
        SELECT cityHash64(cluster, node) AS gh, id, toUInt64(ts) * 1000 + ts_ms AS t
        FROM actions
        WHERE (cluster, node) IN (SELECT cluster, node FROM triggers)
            AND ts >= @since AND ts <= @until
            AND has(@kinds, kind) AND has(@outcomes, outcome)
        UNION ALL
        SELECT cityHash64(cluster, node) AS gh, id, toUInt64(ts) * 1000 + ts_ms AS t
        FROM batch_actions
        WHERE has(@kinds, kind) AND has(@outcomes, outcome)
    )
    LIMIT 1 BY id
) AS w USING (gh)
WHERE t > at_ms - @window_ms AND t <= at_ms
GROUP BY tid
