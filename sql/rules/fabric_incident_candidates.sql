-- FabricIncident sweep candidates: fault signatures reported fatal unhealthy
-- by at least threshold nodes of one cluster in [since, until] (events that
-- arrived on other replicas' partitions are seen here once stored).
-- param: checks Array(String)  checks whose faults can be fabric-wide
SELECT cluster, '' AS node, gkey, ['FABRIC'] AS entity_types, [gkey] AS entity_values
FROM
(
    SELECT cluster, concat(check, '|', error_codes[1]) AS gkey, uniqExact(node) AS nodes
    FROM recent_events
    PREWHERE check IN (SELECT arrayJoin(@checks)) AND ts >= @since AND ts <= @until
    WHERE is_healthy = 0 AND is_fatal = 1
    GROUP BY cluster, gkey
)
WHERE nodes >= @threshold
