-- Nodes quarantined longest: for each node, its latest time quarantined
-- (action kind quarantine, outcome applied, succeeded or dry_run) and
-- whether a release followed (an unquarantine applied, succeeded or
-- dry_run, or a person's manual_uncordon: the fleet page's releases);
-- still-quarantined nodes count until now. The time is measured from the
-- first quarantine after the release before it: the quarantine role writes
-- another applied action for every repeat of a standing fault, so the
-- latest would make a node quarantined for days with hourly repeats look
-- quarantined for an hour.
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
        maxIf(ts, kind = 'quarantine') AS last_quarantine,
        maxIf(ts, kind != 'quarantine') AS last_release,
        last_release < last_quarantine AS still_quarantined,
        -- the release before the latest quarantine (1970 when none)
        arrayReduce('max', arrayFilter(x -> x < last_quarantine, groupArrayIf(ts, kind != 'quarantine'))) AS prior_release,
        arrayReduce('min', arrayFilter(x -> x > prior_release, groupArrayIf(ts, kind = 'quarantine'))) AS quarantined_at,
        argMaxIf(dry_run, ts, kind = 'quarantine') AS dry_run
    FROM
    (
        SELECT cluster, node, id, kind, ts, dry_run
        FROM actions
        WHERE ((kind IN ('quarantine', 'unquarantine') AND outcome IN ('applied', 'succeeded', 'dry_run')) OR kind = 'manual_uncordon')
            AND ts <= @now AND (@cluster = '' OR cluster = @cluster)
        LIMIT 1 BY id
    )
    GROUP BY cluster, node
    HAVING last_quarantine > toDateTime(0)
)
ORDER BY quarantined_seconds DESC, cluster, node
LIMIT @limit
