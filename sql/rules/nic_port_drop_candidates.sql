-- NICPortDrop sweep candidates: ports whose last state-check event in
-- [since, until] is DOWN as nic_port_drop.sql takes it: fatal unhealthy
-- (DOWN, Disabled), or non-fatal unhealthy marked crossings-only
-- (faultline.io/nic-crossings-only: NVSentinel's monitor, which reports no
-- escalation to DOWN). An unmarked non-fatal INIT, ARMED or
-- LinkErrorRecovery (faultline's nic check) is no DOWN. The rule query then decides whether it has
-- lasted hold with no recovery attempt.
-- param: state_checks Array(String)  state-check names
SELECT cluster, node, gkey, entity_types, entity_values
FROM
(
    SELECT
        cluster, node, entity AS gkey,
        argMax(is_healthy = 0 AND (is_fatal = 1 OR has(metadata.key, 'faultline.io/nic-crossings-only')), toUInt64(ts) * 1000 + ts_ms) AS down,
        any(entities.type) AS entity_types,
        any(entities.value) AS entity_values
    FROM recent_events
    PREWHERE check IN (SELECT arrayJoin(@state_checks)) AND ts >= @since AND ts <= @until
    WHERE match(entity, '(^|,)NICPort=')
    GROUP BY cluster, node, entity
)
WHERE down = 1
