-- NICPortDrop: the port (gkey = its entity key) has reported DOWN for at
-- least @hold_ms with no recovery in between: its last state-check event in
-- (at - window, at] is DOWN (kind 1: fatal unhealthy, DOWN or Disabled, or
-- unhealthy marked crossings-only, below), at least
-- hold old, and no link_downed
-- increase came later than grace after it (a later increase means the link
-- trained up and fell again: a recovery attempt, which is a flap, not a drop;
-- the increase that comes with the drop itself falls inside grace).
-- A non-fatal unhealthy state event (INIT or ARMED on InfiniBand,
-- ACTIVE/LinkErrorRecovery, Polling: transient, action NONE; INIT persists
-- while the subnet manager has not configured the port) is no DOWN:
-- faultline's nic check reports an escalation to DOWN as an event of its
-- own, so it counts as up (kind 2), and a port in INIT for 5 min is no drop
-- (it was one: REPLACE_VM at the sweep). One marked crossings-only
-- (metadata faultline.io/nic-crossings-only, stamped by
-- nvsentinel.Normalize) is DOWN (kind 1): NVSentinel's NIC monitor reports
-- nothing for LinkErrorRecovery -> DOWN, so a port it caught in error
-- recovery that then stays down has no other event. An unmarked one (the
-- nic check's, any event stored before the mark) counts as up.
-- value is 1 when dropped, else 0; last_ms is the time of the drop.
-- A port with no state-check event in the window (of any machine) and no
-- recovery attempt of the trigger's machine is still dropped (value 1,
-- last_ms 0): the NIC agent reports a port on a transition only, so a day
-- after the DOWN the window holds nothing, and the state known last is the
-- DOWN its standing verdict was taken on. Only a state event that shows the
-- port up, or an attempt, recovers it. A candidate (the sweep's onset) has
-- its DOWN in the window, so this starts no verdict.
-- Only the trigger's machine's events count (see "The machine" in
-- sql/rules/README.md).
-- param: state_checks Array(String)    state-check names
-- param: counter_checks Array(String)  degradation-check names
-- param: hold_ms UInt64                how long DOWN must last (4m)
-- param: grace_ms UInt64               counter increases this close to the drop are the drop's own
--
-- The triggers' nodes are filtered in PREWHERE: a batch evaluates the few
-- ports with a standing drop, so the entity match and the other columns run
-- on their rows only, not on a day of every node's NIC events (steady
-- correlatebench: this query's time -38 %, 2026-11-28).
SELECT
    tid,
    toFloat64(if(states = 0, length(attempts) = 0,
        last_down > 0 AND last_down > last_up AND last_down + @hold_ms <= eval_ms
        AND arrayCount(x -> x > last_down + @grace_ms, attempts) = 0)) AS value,
    arrayFilter(x -> x != '', [down_id]) AS cause_ids,
    last_down AS last_ms
FROM
(
    SELECT
        tid,
        any(at_ms) AS eval_ms,
        countIf(kind IN (1, 2) AND inw) AS states,
        maxIf(t, kind = 1 AND own) AS last_down,
        maxIf(t, kind = 2 AND own) AS last_up,
        argMaxIf(id, t, kind = 1 AND own) AS down_id,
        groupArrayIf(t, kind = 3 AND own) AS attempts
    FROM
    (
        -- LEFT: a trigger whose window holds no event of the port still has a
        -- row (kind 0, t 0: in no window), its value decided above. inw: in the
        -- window; own: and of the trigger's machine.
        SELECT tid, at_ms, id, t, kind,
            t > at_ms - @window_ms AND t <= at_ms AS inw,
            inw AND (tm = '' OR m = '' OR m = tm) AS own
        FROM (SELECT tid, cityHash64(cluster, node, gkey) AS gh, at_ms, machine AS tm FROM triggers) AS tr
        ALL LEFT JOIN
        (
            SELECT gh, id, t, kind, m
            FROM
            (
                SELECT cityHash64(cluster, node, entity) AS gh, id, toUInt64(ts) * 1000 + ts_ms AS t,
                    toUInt8(multiIf(has(@counter_checks, check), 3, is_healthy = 0 AND (is_fatal = 1 OR has(metadata.key, 'faultline.io/nic-crossings-only')), 1, 2)) AS kind,
                    metadata.value[indexOf(metadata.key, 'faultline.io/system-uuid')] AS m
                FROM recent_events
                PREWHERE ts >= @since AND ts <= @until
                    AND check IN (SELECT arrayJoin(arrayConcat(@state_checks, @counter_checks)))
                    AND cityHash64(cluster, node) IN (SELECT cityHash64(cluster, node) FROM triggers)
                WHERE ((has(@state_checks, check) AND match(entity, '(^|,)NICPort='))
                        OR (has(@counter_checks, check) AND has(error_codes, 'link_downed') AND is_healthy = 0))
                UNION ALL
                SELECT cityHash64(cluster, node, entity) AS gh, id, toUInt64(ts) * 1000 + ts_ms AS t,
                    toUInt8(multiIf(has(@counter_checks, check), 3, is_healthy = 0 AND (is_fatal = 1 OR has(metadata.key, 'faultline.io/nic-crossings-only')), 1, 2)) AS kind,
                    metadata.value[indexOf(metadata.key, 'faultline.io/system-uuid')] AS m
                FROM batch
                WHERE derived_by = '' AND processing_strategy != 'STORE_ONLY'
                    AND ((has(@state_checks, check) AND has(entities.type, 'NICPort'))
                        OR (has(@counter_checks, check) AND has(error_codes, 'link_downed') AND is_healthy = 0))
            )
            LIMIT 1 BY id
        ) AS w USING (gh)
    )
    GROUP BY tid
)
