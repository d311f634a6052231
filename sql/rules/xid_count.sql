-- RepeatedXID31OnSameGPU (and any "N occurrences of these codes on one GPU"
-- rule): occurrences of the codes on one GPU (gkey = the event's entity key)
-- in (at - window, at]. An event stands for metadata "count" occurrences
-- (kmsg flood summaries; 1 when absent), so the value is their sum.
-- The GPU is matched by identity, not by the exact entity key: an event
-- counts for the trigger's GPU when its key is the trigger's, when both
-- name the same PCI address and not two different UUIDs (the kmsg agent
-- names a GPU "PCI=…" alone until it knows its UUID, "PCI=…,GPU=GPU-…"
-- after), or when both name the same UUID. Only the trigger's machine's
-- events count (see "The machine" in sql/rules/README.md).
-- The codes are filtered in PREWHERE: the entity and metadata lookups run
-- on the counted codes' rows only, not on a day of every Xid (the Xid 31
-- query alone: -20 % on correlatebench's history, where Xid 31 is a sixth
-- of the Xids).
-- param: checks Array(String)  Xid check names
-- param: codes Array(String)   error codes counted, e.g. ['XID-31']
SELECT
    tid,
    toFloat64(sum(n)) AS value,
    arraySlice(arraySort(groupUniqArray(id)), 1, 100) AS cause_ids,
    max(t) AS last_ms
FROM
(
    SELECT tid, cityHash64(cluster, node) AS nh, at_ms, gkey, machine AS tm,
        extract(gkey, 'GPU=([^,]+)') AS tgpu, extract(gkey, 'PCI=([^,]+)') AS tpci
    FROM triggers
) AS tr
ALL INNER JOIN
(
    SELECT nh, id, t, n, entity, gpu, pci, m
    FROM
    (
        SELECT cityHash64(cluster, node) AS nh, id, toUInt64(ts) * 1000 + ts_ms AS t, entity,
            entities.value[indexOf(entities.type, 'GPU')] AS gpu, entities.value[indexOf(entities.type, 'PCI')] AS pci,
            greatest(toUInt64OrZero(metadata.value[indexOf(metadata.key, 'count')]), 1) AS n,
            metadata.value[indexOf(metadata.key, 'faultline.io/system-uuid')] AS m
        FROM recent_events
        PREWHERE check IN (SELECT arrayJoin(@checks)) AND ts >= @since AND ts <= @until
            AND hasAny(error_codes, @codes) AND is_healthy = 0
        WHERE cityHash64(cluster, node) IN (SELECT cityHash64(cluster, node) FROM triggers)
        UNION ALL
        SELECT cityHash64(cluster, node) AS nh, id, toUInt64(ts) * 1000 + ts_ms AS t, entity,
            entities.value[indexOf(entities.type, 'GPU')] AS gpu, entities.value[indexOf(entities.type, 'PCI')] AS pci,
            greatest(toUInt64OrZero(metadata.value[indexOf(metadata.key, 'count')]), 1) AS n,
            metadata.value[indexOf(metadata.key, 'faultline.io/system-uuid')] AS m
        FROM batch
        WHERE has(@checks, check) AND hasAny(error_codes, @codes) AND is_healthy = 0
            AND derived_by = '' AND processing_strategy != 'STORE_ONLY'
    )
    LIMIT 1 BY id
) AS w USING (nh)
WHERE t > at_ms - @window_ms AND t <= at_ms AND (tm = '' OR m = '' OR m = tm)
    AND (entity = gkey
        OR (tpci != '' AND pci = tpci AND (tgpu = '' OR gpu = '' OR gpu = tgpu))
        OR (tgpu != '' AND gpu = tgpu))
GROUP BY tid
