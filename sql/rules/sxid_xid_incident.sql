-- NVSwitchSXidGPUXid: an NVSwitch SXid and the GPU Xids it caused are one
-- incident (FM guide, Fatal SXid Errors: a fatal SXid on an access port is
-- propagated to the GPU on that port, which reports Xid 74 and Xid 45; the
-- non-fatal 11004 and 12028 stall the GPU's NVLink traffic and end in
-- Xid 45). Triggers are the GPU's Xids (gkey = the Xid event's entity key,
-- "PCI=...,GPU=..."); an SXid belongs to the incident when it names the same
-- GPU: its GPU entity (the GPU on the SXid's access port, from the NVLink
-- port map) or its metadata gpu_pci. value = the incident's SXid events in
-- (at - window, at] when the GPU has a matching Xid there too, else no row;
-- cause_ids = the SXid and Xid event ids: one verdict, both causes.
-- Only the trigger's machine's events count (see "The machine" in
-- sql/rules/README.md).
-- param: sxid_checks Array(String)          SXid check names (kernel log, FM log)
-- param: nonfatal_sxid_codes Array(String)  non-fatal SXids that cause Xid 45
-- param: xid_checks Array(String)           Xid check names
-- param: xid_codes Array(String)            the Xids an SXid causes
SELECT
    s.tid AS tid,
    toFloat64(s.sn) AS value,
    arraySlice(arraySort(arrayConcat(s.sids, x.xids)), 1, 100) AS cause_ids,
    greatest(s.slast, x.xlast) AS last_ms
FROM
(
    SELECT tid, uniqExact(id) AS sn, groupUniqArray(id) AS sids, max(t) AS slast
    FROM
    (
        SELECT tid, cityHash64(cluster, node) AS nh, at_ms, machine AS tm,
            extract(gkey, 'GPU=([^,]+)') AS tgpu, extract(gkey, 'PCI=([^,]+)') AS tpci
        FROM triggers
    ) AS tr
    ALL INNER JOIN
    (
        SELECT nh, id, t, gpu, gpci, m
        FROM
        (
            SELECT cityHash64(cluster, node) AS nh, id, toUInt64(ts) * 1000 + ts_ms AS t,
                entities.value[indexOf(entities.type, 'GPU')] AS gpu,
                metadata.value[indexOf(metadata.key, 'gpu_pci')] AS gpci,
                metadata.value[indexOf(metadata.key, 'faultline.io/system-uuid')] AS m
            FROM recent_events
            PREWHERE check IN (SELECT arrayJoin(@sxid_checks)) AND ts >= @since AND ts <= @until
            WHERE cityHash64(cluster, node) IN (SELECT cityHash64(cluster, node) FROM triggers)
                AND is_healthy = 0 AND (is_fatal = 1 OR hasAny(error_codes, @nonfatal_sxid_codes))
            UNION ALL
            SELECT cityHash64(cluster, node) AS nh, id, toUInt64(ts) * 1000 + ts_ms AS t,
                entities.value[indexOf(entities.type, 'GPU')] AS gpu,
                metadata.value[indexOf(metadata.key, 'gpu_pci')] AS gpci,
                metadata.value[indexOf(metadata.key, 'faultline.io/system-uuid')] AS m
            FROM batch
            WHERE has(@sxid_checks, check) AND is_healthy = 0 AND (is_fatal = 1 OR hasAny(error_codes, @nonfatal_sxid_codes))
                AND derived_by = '' AND processing_strategy != 'STORE_ONLY'
        )
        LIMIT 1 BY id
    ) AS sx USING (nh)
    WHERE t > at_ms - @window_ms AND t <= at_ms AND (tm = '' OR m = '' OR m = tm)
        AND ((tgpu != '' AND gpu = tgpu) OR (tpci != '' AND gpci = tpci))
    GROUP BY tid
) AS s
ALL INNER JOIN
(
    SELECT tid, groupUniqArray(id) AS xids, max(xt) AS xlast
    FROM (SELECT tid, cityHash64(cluster, node, gkey) AS gh, at_ms, machine AS tm FROM triggers) AS tx
    ALL INNER JOIN
    (
        SELECT gh, id, xt, m
        FROM
        (
            SELECT cityHash64(cluster, node, entity) AS gh, id, toUInt64(ts) * 1000 + ts_ms AS xt,
                metadata.value[indexOf(metadata.key, 'faultline.io/system-uuid')] AS m
            FROM recent_events
            PREWHERE check IN (SELECT arrayJoin(@xid_checks)) AND ts >= @since AND ts <= @until
            WHERE cityHash64(cluster, node) IN (SELECT cityHash64(cluster, node) FROM triggers)
                AND hasAny(error_codes, @xid_codes) AND is_healthy = 0
            UNION ALL
            SELECT cityHash64(cluster, node, entity) AS gh, id, toUInt64(ts) * 1000 + ts_ms AS xt,
                metadata.value[indexOf(metadata.key, 'faultline.io/system-uuid')] AS m
            FROM batch
            WHERE has(@xid_checks, check) AND hasAny(error_codes, @xid_codes) AND is_healthy = 0
                AND derived_by = '' AND processing_strategy != 'STORE_ONLY'
        )
        LIMIT 1 BY id
    ) AS xr USING (gh)
    WHERE xt > at_ms - @window_ms AND xt <= at_ms AND (tm = '' OR m = '' OR m = tm)
    GROUP BY tid
) AS x USING (tid)
