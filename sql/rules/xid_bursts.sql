-- RepeatedXIDOnSameGPU: how many separate bursts the fatal Xid events of one
-- GPU (gkey = the event's entity key, "PCI=…,GPU=GPU-…") form in
-- (at - window, at]. Each event keeps its burst open until its horizon,
-- its time + gap (sticky_gap for the sticky codes, e.g. Xid 74, 79, 95,
-- 109, 119); an event after every earlier event's horizon starts a new
-- burst. In one sorted pass (n log n in a GPU's events, which a storm of
-- Xids makes many): each event opens a span at its time (+1) and closes it
-- at its horizon (-1), an opening sorting before a closing at the same
-- time (an event at an earlier one's horizon continues its burst); an
-- event starts a burst where its opening leaves exactly one span open.
-- A flood summary (metadata count=N) is one point in time like any
-- other event: bursts count time, not occurrences.
-- The GPU is matched by identity, not by the exact entity key: an event
-- counts for the trigger's GPU when its key is the trigger's, when both
-- name the same PCI address and not two different UUIDs (the kmsg agent
-- names a GPU "PCI=…" alone until it knows its UUID, "PCI=…,GPU=GPU-…"
-- after), or when both name the same UUID.
-- Only the trigger's machine's events count (see "The machine" in
-- sql/rules/README.md). Fatal and unhealthy are filtered in PREWHERE, so
-- the lookups run on the counted rows only.
-- param: checks Array(String)        Xid check names
-- param: sticky_codes Array(String)  error codes that keep a burst open for sticky_gap
-- param: gap_ms UInt64               quiet time that ends a burst (3m)
-- param: sticky_gap_ms UInt64        how long a sticky code keeps it open (3h)
SELECT
    tid,
    toFloat64(arrayCount((d, open) -> d = 1 AND open = 1, deltas, arrayCumSum(deltas))) AS value,
    arraySlice(arraySort(ids), 1, 100) AS cause_ids,
    toUInt64(arrayReduce('max', ts)) AS last_ms
FROM
(
    SELECT
        tid, ids, ts,
        -- keys: an opening at time * 2, a closing at horizon * 2 + 1
        arraySort((d, k) -> k,
            arrayConcat(arrayMap(x -> toInt64(1), ts), arrayMap(x -> toInt64(-1), hs)),
            arrayConcat(arrayMap(x -> x * 2, ts), arrayMap(x -> x * 2 + 1, hs))) AS deltas
    FROM
    (
        SELECT tid, groupArray(id) AS ids, groupArray(t) AS ts, groupArray(h) AS hs
        FROM
        (
            SELECT tid, cityHash64(cluster, node) AS nh, at_ms, gkey, machine AS tm,
                extract(gkey, 'GPU=([^,]+)') AS tgpu, extract(gkey, 'PCI=([^,]+)') AS tpci
            FROM triggers
        ) AS tr
        ALL INNER JOIN
        (
            SELECT nh, id, t, t + if(sticky = 1, @sticky_gap_ms, @gap_ms) AS h, entity, gpu, pci, m
            FROM
            (
                SELECT cityHash64(cluster, node) AS nh, id, toUInt64(ts) * 1000 + ts_ms AS t, entity,
                    entities.value[indexOf(entities.type, 'GPU')] AS gpu, entities.value[indexOf(entities.type, 'PCI')] AS pci,
                    toUInt8(hasAny(error_codes, @sticky_codes)) AS sticky,
                    metadata.value[indexOf(metadata.key, 'faultline.io/system-uuid')] AS m
                FROM recent_events
                PREWHERE check IN (SELECT arrayJoin(@checks)) AND ts >= @since AND ts <= @until
                    AND is_fatal = 1 AND is_healthy = 0
                WHERE cityHash64(cluster, node) IN (SELECT cityHash64(cluster, node) FROM triggers)
                UNION ALL
                SELECT cityHash64(cluster, node) AS nh, id, toUInt64(ts) * 1000 + ts_ms AS t, entity,
                    entities.value[indexOf(entities.type, 'GPU')] AS gpu, entities.value[indexOf(entities.type, 'PCI')] AS pci,
                    toUInt8(hasAny(error_codes, @sticky_codes)) AS sticky,
                    metadata.value[indexOf(metadata.key, 'faultline.io/system-uuid')] AS m
                FROM batch
                WHERE has(@checks, check) AND is_fatal = 1 AND is_healthy = 0
                    AND derived_by = '' AND processing_strategy != 'STORE_ONLY'
            )
            LIMIT 1 BY id
        ) AS w USING (nh)
        WHERE t > at_ms - @window_ms AND t <= at_ms AND (tm = '' OR m = '' OR m = tm)
            AND (entity = gkey
                OR (tpci != '' AND pci = tpci AND (tgpu = '' OR gpu = '' OR gpu = tgpu))
                OR (tgpu != '' AND gpu = tgpu))
        GROUP BY tid
    )
)
