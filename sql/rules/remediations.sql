-- MultipleRemediations: remediation actions on one node (scope node, gkey '')
-- in (at - window, at], from the actions table and the batch's actions,
-- counted from the node's newest Node object only. A node name outlives
-- its machine (an AWS node is named by an IP a replacement is often given,
-- a replaced server keeps its hostname); the replacement registers a new
-- Node, and its predecessor's remediations are not its own. The quarantine
-- role's actions carry the creationTimestamp of the Node they were applied
-- to (details nodeCreated, RFC 3339): the newest of them in the window up
-- to the evaluation bounds what counts (none: everything in the window).
-- param: kinds Array(String)     action kinds that are remediations
-- param: outcomes Array(String)  outcomes that mean it was done
SELECT
    tid,
    toFloat64(count()) AS value,
    arraySlice(arraySort(groupArray(id)), 1, 100) AS cause_ids,
    max(t) AS last_ms
FROM
(
    SELECT
        tid,
        max(created_ms) AS created,
        groupArrayIf(id, counted = 1) AS counted_ids,
        groupArrayIf(t, counted = 1) AS counted_t
    FROM (SELECT tid, cityHash64(cluster, node) AS gh, at_ms FROM triggers) AS tr
    ALL INNER JOIN
    (
        SELECT gh, id, t, counted, created_ms
        FROM
        (
            SELECT cityHash64(cluster, node) AS gh, id, toUInt64(ts) * 1000 + ts_ms AS t,
                toUInt8(has(@kinds, kind) AND has(@outcomes, outcome)) AS counted,
                toUInt64(parseDateTimeBestEffortOrZero(details.value[indexOf(details.key, 'nodeCreated')])) * 1000 AS created_ms
            FROM actions
            WHERE (cluster, node) IN (SELECT cluster, node FROM triggers)
                AND ts >= @since AND ts <= @until
                AND ((has(@kinds, kind) AND has(@outcomes, outcome)) OR has(details.key, 'nodeCreated'))
            UNION ALL
            SELECT cityHash64(cluster, node) AS gh, id, toUInt64(ts) * 1000 + ts_ms AS t,
                toUInt8(has(@kinds, kind) AND has(@outcomes, outcome)) AS counted,
                toUInt64(parseDateTimeBestEffortOrZero(details.value[indexOf(details.key, 'nodeCreated')])) * 1000 AS created_ms
            FROM batch_actions
            WHERE (has(@kinds, kind) AND has(@outcomes, outcome)) OR has(details.key, 'nodeCreated')
        )
        LIMIT 1 BY id
    ) AS w USING (gh)
    WHERE t > at_ms - @window_ms AND t <= at_ms
    GROUP BY tid
)
ARRAY JOIN counted_ids AS id, counted_t AS t
WHERE t >= created
GROUP BY tid
