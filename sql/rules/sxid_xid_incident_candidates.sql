-- NVSwitchSXidGPUXid sweep candidates: GPUs with an Xid of the incident in
-- [since, until] and an SXid naming the same GPU in that window — found
-- when the SXid arrived after the Xid (the FM log is read on the fabric
-- check's poll, the kernel log at once), so the incident is judged at the
-- sweep with both in its window. Returns the Xid's group (its entity key).
-- param: sxid_checks Array(String)
-- param: nonfatal_sxid_codes Array(String)
-- param: xid_checks Array(String)
-- param: xid_codes Array(String)
SELECT cluster, node, gkey, entity_types, entity_values
FROM
(
    SELECT cluster, node, entity AS gkey, any(entities.type) AS entity_types, any(entities.value) AS entity_values,
        cityHash64(cluster, node) AS nh, extract(entity, 'GPU=([^,]+)') AS tgpu, extract(entity, 'PCI=([^,]+)') AS tpci
    FROM recent_events
    PREWHERE check IN (SELECT arrayJoin(@xid_checks)) AND ts >= @since AND ts <= @until
    WHERE hasAny(error_codes, @xid_codes) AND is_healthy = 0
    GROUP BY cluster, node, entity
) AS xg
ALL INNER JOIN
(
    SELECT cityHash64(cluster, node) AS nh,
        entities.value[indexOf(entities.type, 'GPU')] AS gpu,
        metadata.value[indexOf(metadata.key, 'gpu_pci')] AS gpci
    FROM recent_events
    PREWHERE check IN (SELECT arrayJoin(@sxid_checks)) AND ts >= @since AND ts <= @until
    WHERE is_healthy = 0 AND (is_fatal = 1 OR hasAny(error_codes, @nonfatal_sxid_codes))
) AS sg USING (nh)
WHERE (tgpu != '' AND gpu = tgpu) OR (tpci != '' AND gpci = tpci)
LIMIT 1 BY cluster, node, gkey
