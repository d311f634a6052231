-- Conformance groups per cluster: the nodes whose latest report (within
-- the staleness window before until) has each fingerprint, largest group
-- first, with the nodes the conformance role holds drifted (their latest
-- conformance_drift / conformance_restored action is a drift). Nodes
-- without a fresh report are not listed (they are unknown).
-- param: until DateTime now        reports and actions before this time
-- param: staleness UInt64 46800    seconds: older reports are stale (13h, the role's default)
-- param: cluster String ''         only this cluster ('' for all)
SELECT
    cluster,
    fingerprint,
    count() AS nodes,
    round(count() / any(cluster_nodes), 4) AS share,
    arraySort(groupArray(node)) AS node_list,
    countIf(is_drifted = 1) AS drifted,
    arraySort(groupArrayIf(node, is_drifted = 1)) AS drifted_nodes
FROM
(
    SELECT
        cluster,
        node,
        argMaxIf(fp, t, src = 'r') AS fingerprint,
        argMaxIf(kind, t, src = 'a') = 'conformance_drift' AS is_drifted,
        countIf(src = 'r') AS reports
    FROM
    (
        SELECT cluster, node, fingerprint AS fp, '' AS kind, toUInt64(ts) * 1000 + ts_ms AS t, 'r' AS src
        FROM conformance
        WHERE ts < @until AND ts >= @until - @staleness AND (@cluster = '' OR cluster = @cluster)
        UNION ALL
        SELECT cluster, node, '' AS fp, kind, toUInt64(ts) * 1000 + ts_ms AS t, 'a' AS src
        FROM actions
        WHERE role = 'conformance' AND kind IN ('conformance_drift', 'conformance_restored')
            AND ts < @until AND (@cluster = '' OR cluster = @cluster)
    )
    GROUP BY cluster, node
    HAVING reports > 0
) AS n
ANY LEFT JOIN
(
    SELECT cluster, uniqExact(node) AS cluster_nodes
    FROM conformance
    WHERE ts < @until AND ts >= @until - @staleness AND (@cluster = '' OR cluster = @cluster)
    GROUP BY cluster
) AS c USING (cluster)
GROUP BY cluster, fingerprint
ORDER BY cluster, nodes DESC, fingerprint
