-- Nodes quarantined longest: for each node, its latest quarantine (action
-- kind quarantine, outcome applied, succeeded or dry_run) and whether an
-- unquarantine followed; still-quarantined nodes count until now.
-- param: now DateTime now     the time "still quarantined" is measured to
-- param: cluster String ''    only this cluster ('' for all)
-- param: limit UInt64 50      at most this many nodes
SELECT
    cluster,
    node,
    quarantined_at,
    still_quarantined,
    if(still_quarantined = 1, '', toString(last_release)) AS released_at,
    toUInt32(if(still_quarantined = 1, @now, last_release)) - toUInt32(quarantined_at) AS quarantined_seconds,
    dry_run
FROM
(
    SELECT
        cluster,
        node,
        maxIf(ts, kind = 'quarantine') AS quarantined_at,
        maxIf(ts, kind = 'unquarantine') AS last_release,
        last_release < quarantined_at AS still_quarantined,
        argMaxIf(dry_run, ts, kind = 'quarantine') AS dry_run
    FROM
    (
        SELECT cluster, node, id, kind, ts, dry_run
        FROM actions
        WHERE kind IN ('quarantine', 'unquarantine')
            AND outcome IN ('applied', 'succeeded', 'dry_run')
            AND ts <= @now AND (@cluster = '' OR cluster = @cluster)
        LIMIT 1 BY id
    )
    GROUP BY cluster, node
    HAVING quarantined_at > toDateTime(0)
)
ORDER BY quarantined_seconds DESC, cluster, node
LIMIT @limit
