-- Window query of the correlation rules (RepeatedXIDOnSameGPU): per GPU of
-- one node, the distinct fatal events of one check in the window seconds up
-- to until, and how many bursts they form (a burst ends after gap seconds
-- without an event).
-- param: cluster String ''   the cluster
-- param: node String ''      the node
-- param: check String ''     the check name (e.g. the XID check)
-- param: until DateTime now  end of the window (inclusive)
-- param: window UInt64 86400 window length in seconds
-- param: gap UInt64 180      seconds of quiet that end a burst
SELECT
    entity AS gpu,
    length(t) AS events,
    arrayCount((x, p) -> x - p > @gap, t, arrayPushFront(arrayPopBack(t), 0)) AS bursts
FROM
(
    SELECT entity, arraySort(groupArray(toUInt32(ts))) AS t
    FROM
    (
        SELECT entity, id, ts
        FROM events
        WHERE cluster = @cluster AND node = @node AND check = @check
            AND ts > @until - @window AND ts <= @until
            AND is_fatal = 1
        LIMIT 1 BY id
    )
    GROUP BY entity
)
ORDER BY gpu
