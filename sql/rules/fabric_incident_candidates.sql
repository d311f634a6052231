-- FabricIncident sweep candidates: fault signatures reported fatal unhealthy
-- by at least threshold nodes of one cluster in [since, until] (events that
-- arrived on other replicas' partitions are seen here once stored), or, for
-- a NIC port state check, non-fatal unhealthy marked crossings-only
-- (faultline.io/nic-crossings-only: NVSentinel's NIC monitor), as
-- fabric_incident.sql counts them.
-- param: checks Array(String)        checks whose faults can be fabric-wide
-- param: state_checks Array(String)  NIC state-check names (their non-fatal port events marked crossings-only count)
SELECT cluster, '' AS node, gkey, ['FABRIC'] AS entity_types, [gkey] AS entity_values
FROM
(
    SELECT cluster, concat(check, '|', error_codes[1]) AS gkey, uniqExact(node) AS nodes
    FROM recent_events
    PREWHERE check IN (SELECT arrayJoin(@checks)) AND ts >= @since AND ts <= @until
    WHERE is_healthy = 0
        AND (is_fatal = 1 OR (has(@state_checks, check) AND match(entity, '(^|,)NICPort=')
            AND has(metadata.key, 'faultline.io/nic-crossings-only')))
    GROUP BY cluster, gkey
)
WHERE nodes >= @threshold
