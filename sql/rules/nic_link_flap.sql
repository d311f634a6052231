-- RepeatedNICLinkFlap: link-downs of one NIC port (gkey = the port's
-- entity key "NIC=mlx5_0,NICPort=1") in (at - window, at].
-- A flap is a transition: a state-check down is a fatal unhealthy state
-- event of the port (DOWN, Disabled) whose previous state event (per port
-- in time order, over every source) is not fatal-unhealthy, or that is the
-- port's first state event read (the port was up before, or it would not
-- be reported). A non-fatal unhealthy event (ACTIVE/LinkErrorRecovery,
-- INIT or ARMED on InfiniBand, Polling: transient, action NONE) is no
-- down: faultline's nic check reports the escalation to DOWN as an event
-- of its own, so three error recoveries of a port whose link never went
-- down are no flap (they were counted like a DOWN: a healthy node's
-- REPLACE_VM). One marked crossings-only (metadata
-- faultline.io/nic-crossings-only, events.MetaNICCrossingsOnly, stamped by
-- nvsentinel.Normalize) counts as fatal: NVSentinel's NIC monitor reports
-- one event per healthy <-> unhealthy crossing and none for
-- LinkErrorRecovery -> DOWN, so its non-fatal event may be the only report
-- of a link that went down. An unmarked one (the nic check's, any event
-- stored before the mark) is no down. Fatal events
-- with no other state between are one down: a DOWN reported again (the
-- agent restarted between spooling it and saving its state: a new id and
-- time); a second source's report of the same DOWN (NVSentinel's NIC
-- monitor beside faultline's nic check). The NIC agent's escalation
-- ACTIVE -> LinkErrorRecovery (non-fatal) -> DOWN (fatal) is one down, at
-- the DOWN. A link_downed counter increase from the degradation check
-- counts its delta. One real flap usually produces both a state event and
-- a counter increase, so the two are not added: the value is
-- max(state-check downs, sum of link_downed deltas), which also counts the
-- sub-second flaps only the counter sees.
-- Only the trigger's machine's events count (see "The machine" in
-- sql/rules/README.md).
-- param: state_checks Array(String)    state-check names
-- param: counter_checks Array(String)  degradation-check names
SELECT
    tid,
    toFloat64(greatest(countIf(down = 1), sumIf(delta, down = 0))) AS value,
    arraySlice(arraySort(groupUniqArray(id)), 1, 100) AS cause_ids,
    max(t) AS last_ms
FROM (SELECT tid, cityHash64(cluster, node, gkey) AS gh, at_ms, machine AS tm FROM triggers) AS tr
ALL INNER JOIN
(
    -- per port, its state events in time order: a fatal unhealthy one
    -- counts (down = 1) when it is the first or follows one that is not
    -- (a crossing into DOWN); counter increases (down = 0) are kept as
    -- they are; the other state events only tell crossings apart;
    -- a state event of another machine before it (a machine swap: both
    -- name their machine, and not the same) is no state of this port
    SELECT gh, tupleElement(r, 1) AS id, tupleElement(r, 2) AS t, tupleElement(r, 3) AS down, tupleElement(r, 4) AS delta,
        tupleElement(r, 5) AS m
    FROM
    (
        SELECT gh,
            arrayConcat(
                arrayFilter((x, i) -> kinds_s[i] = 1
                    AND (i = 1 OR kinds_s[i - 1] != 1 OR (ms_s[i - 1] != ms_s[i] AND ms_s[i - 1] != '' AND ms_s[i] != '')),
                    -- kinds_s is an argument so that 18.16 reads it for the filter's lambda
                    arrayMap((a, b, k, mm) -> tuple(a, b, toUInt8(1), toUInt64(0), mm), ids_s, ts_s, kinds_s, ms_s), arrayEnumerate(ids_s)),
                arrayMap((a, b, d, mm) -> tuple(a, b, toUInt8(0), d, mm), cids, cts, cdeltas, cms)) AS rs
        FROM
        (
            SELECT gh,
                -- sorted by time, then kind (one key, so the four sort alike)
                arraySort((x, y) -> y, groupArrayIf(id, kind != 2), groupArrayIf(t * 4 + kind, kind != 2)) AS ids_s,
                arraySort((x, y) -> y, groupArrayIf(t, kind != 2), groupArrayIf(t * 4 + kind, kind != 2)) AS ts_s,
                arraySort((x, y) -> y, groupArrayIf(kind, kind != 2), groupArrayIf(t * 4 + kind, kind != 2)) AS kinds_s,
                arraySort((x, y) -> y, groupArrayIf(m, kind != 2), groupArrayIf(t * 4 + kind, kind != 2)) AS ms_s,
                groupArrayIf(id, kind = 2) AS cids,
                groupArrayIf(t, kind = 2) AS cts,
                groupArrayIf(delta, kind = 2) AS cdeltas,
                groupArrayIf(m, kind = 2) AS cms
            FROM
            (
                -- kind: 0 healthy state event, 1 fatal unhealthy (or non-fatal of a source
                -- that reports no escalation: marked crossings-only), 3 non-fatal unhealthy
                -- (unmarked: faultline's nic check), 2 link_downed increase
                SELECT gh, id, t, kind, delta, m
                FROM
                (
                    SELECT cityHash64(cluster, node, entity) AS gh, id, toUInt64(ts) * 1000 + ts_ms AS t,
                        toUInt8(multiIf(has(@counter_checks, check), 2, is_healthy = 1, 0, is_fatal = 1 OR has(metadata.key, 'faultline.io/nic-crossings-only'), 1, 3)) AS kind,
                        greatest(toUInt64OrZero(metadata.value[indexOf(metadata.key, 'delta')]), 1) AS delta,
                        metadata.value[indexOf(metadata.key, 'faultline.io/system-uuid')] AS m
                    FROM recent_events
                    PREWHERE ts >= @since AND ts <= @until
                        AND check IN (SELECT arrayJoin(arrayConcat(@state_checks, @counter_checks)))
                    WHERE cityHash64(cluster, node) IN (SELECT cityHash64(cluster, node) FROM triggers)
                        AND ((has(@state_checks, check) AND match(entity, '(^|,)NICPort='))
                            OR (has(@counter_checks, check) AND has(error_codes, 'link_downed') AND is_healthy = 0))
                    UNION ALL
                    SELECT cityHash64(cluster, node, entity) AS gh, id, toUInt64(ts) * 1000 + ts_ms AS t,
                        toUInt8(multiIf(has(@counter_checks, check), 2, is_healthy = 1, 0, is_fatal = 1 OR has(metadata.key, 'faultline.io/nic-crossings-only'), 1, 3)) AS kind,
                        greatest(toUInt64OrZero(metadata.value[indexOf(metadata.key, 'delta')]), 1) AS delta,
                        metadata.value[indexOf(metadata.key, 'faultline.io/system-uuid')] AS m
                    FROM batch
                    WHERE derived_by = '' AND processing_strategy != 'STORE_ONLY'
                        AND ((has(@state_checks, check) AND has(entities.type, 'NICPort'))
                            OR (has(@counter_checks, check) AND has(error_codes, 'link_downed') AND is_healthy = 0))
                )
                LIMIT 1 BY id
            )
            GROUP BY gh
        )
    )
    ARRAY JOIN rs AS r
) AS w USING (gh)
WHERE t > at_ms - @window_ms AND t <= at_ms AND (tm = '' OR m = '' OR m = tm)
GROUP BY tid
