-- Node page: the faults faultline holds a node quarantined for: per check
-- and impacted entities, the latest quarantine applied (or decided in
-- dry-run) after the node's last release and after that fault's own
-- recovery, with the rule, the taint and cordon it set and the events that
-- caused it. A dry-run fault applied nothing, so no unquarantine ends it:
-- it is left out once its latest event (by generated time) is healthy.
-- Times are Unix milliseconds.
-- param: cluster String ''   the cluster
-- param: node String ''      the node
-- param: now DateTime now    the state as of this time
SELECT
    check,
    entities,
    toUInt64(q_at) AS since_ms,
    rule,
    reason,
    taint,
    cordon,
    dry_run,
    event_ids
FROM
(
    SELECT
        check,
        entities,
        maxIf(t, kind = 'quarantine') AS q_at,
        maxIf(t, kind = 'unquarantine') AS u_at,
        argMaxIf(rule, t, kind = 'quarantine') AS rule,
        argMaxIf(reason, t, kind = 'quarantine') AS reason,
        argMaxIf(taint, t, kind = 'quarantine') AS taint,
        argMaxIf(cordon, t, kind = 'quarantine') AS cordon,
        argMaxIf(dry_run, t, kind = 'quarantine') AS dry_run,
        argMaxIf(event_ids, t, kind = 'quarantine') AS event_ids
    FROM
    (
        SELECT id, kind, check, rule, reason, dry_run, event_ids, toUInt64(ts) * 1000 + ts_ms AS t,
            details.value[indexOf(details.key, 'entities')] AS entities,
            details.value[indexOf(details.key, 'taint')] AS taint,
            details.value[indexOf(details.key, 'cordon')] AS cordon
        FROM actions
        WHERE cluster = @cluster AND node = @node AND ts <= @now
            AND ((kind = 'quarantine' AND outcome IN ('applied', 'dry_run')) OR (kind = 'unquarantine' AND outcome IN ('applied', 'in_progress')))
    )
    GROUP BY check, entities
    HAVING q_at > u_at AND q_at > ifNull((
        SELECT max(toUInt64(ts) * 1000 + ts_ms)
        FROM actions
        WHERE cluster = @cluster AND node = @node AND ts <= @now
            AND ((kind = 'unquarantine' AND outcome = 'applied') OR kind = 'manual_uncordon')
    ), 0)
) AS a
ANY LEFT JOIN
(
    SELECT check, entity AS entities, argMax(is_healthy, toUInt64(ts) * 1000 + ts_ms) AS recovered
    FROM events
    WHERE cluster = @cluster AND node = @node AND ts <= @now
        AND (check, entity) GLOBAL IN (
            SELECT check, details.value[indexOf(details.key, 'entities')]
            FROM actions
            WHERE cluster = @cluster AND node = @node AND ts <= @now AND kind = 'quarantine' AND outcome = 'dry_run')
    GROUP BY check, entity
) AS r USING check, entities
WHERE NOT (dry_run = 1 AND recovered = 1)
ORDER BY since_ms DESC, check, entities
