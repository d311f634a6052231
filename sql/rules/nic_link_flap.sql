-- RepeatedNICLinkFlap: link-down occurrences on one NIC port (gkey = the
-- port's entity key "NIC=mlx5_0,NICPort=1") in (at - window, at].
-- A link-down is a state-check event reporting the port unhealthy (the
-- healthy->unhealthy crossing) or a link_downed counter increase from the
-- degradation check. A fatal state event right after a non-fatal unhealthy
-- one (no healthy event between) is not another down: the NIC agent
-- reports a port going ACTIVE -> LinkErrorRecovery/INIT (non-fatal) ->
-- DOWN (fatal) as two unhealthy events, its escalation, and the port went
-- down once. One real flap usually produces both a state event and a
-- counter increase, so the two are not added: the value is
-- max(state-check downs, sum of link_downed deltas), which also counts
-- the sub-second flaps only the counter sees.
-- param: state_checks Array(String)    state-check names
-- param: counter_checks Array(String)  degradation-check names
SELECT
    tid,
    toFloat64(greatest(countIf(down = 1), sumIf(delta, down = 0))) AS value,
    arraySlice(arraySort(groupUniqArray(id)), 1, 100) AS cause_ids,
    max(t) AS last_ms
FROM (SELECT tid, cityHash64(cluster, node, gkey) AS gh, at_ms FROM triggers) AS tr
ALL INNER JOIN
(
    -- per port, its state events in time order: an unhealthy one counts
    -- (down = 1) unless it is a fatal one right after a non-fatal unhealthy
    -- one (an escalation); counter increases (down = 0) are kept as they
    -- are; healthy state events only tell escalations apart
    SELECT gh, tupleElement(r, 1) AS id, tupleElement(r, 2) AS t, tupleElement(r, 3) AS down, tupleElement(r, 4) AS delta
    FROM
    (
        SELECT gh,
            arrayConcat(
                arrayFilter((x, i) -> kinds_s[i] != 0 AND NOT (kinds_s[i] = 1 AND i > 1 AND kinds_s[i - 1] = 3),
                    arrayMap((a, b, k) -> tuple(a, b, toUInt8(1), toUInt64(0)), ids_s, ts_s, kinds_s), arrayEnumerate(ids_s)),
                arrayMap((a, b, d) -> tuple(a, b, toUInt8(0), d), cids, cts, cdeltas)) AS rs
        FROM
        (
            SELECT gh,
                -- sorted by time, then kind (one key, so the three sort alike)
                arraySort((x, y) -> y, groupArrayIf(id, kind != 2), groupArrayIf(t * 4 + kind, kind != 2)) AS ids_s,
                arraySort((x, y) -> y, groupArrayIf(t, kind != 2), groupArrayIf(t * 4 + kind, kind != 2)) AS ts_s,
                arraySort((x, y) -> y, groupArrayIf(kind, kind != 2), groupArrayIf(t * 4 + kind, kind != 2)) AS kinds_s,
                groupArrayIf(id, kind = 2) AS cids,
                groupArrayIf(t, kind = 2) AS cts,
                groupArrayIf(delta, kind = 2) AS cdeltas
            FROM
            (
                -- kind: 0 healthy state event, 1 fatal unhealthy, 3 non-fatal unhealthy, 2 link_downed increase
                SELECT gh, id, t, kind, delta
                FROM
                (
                    SELECT cityHash64(cluster, node, entity) AS gh, id, toUInt64(ts) * 1000 + ts_ms AS t,
                        toUInt8(multiIf(has(@counter_checks, check), 2, is_healthy = 1, 0, is_fatal = 1, 1, 3)) AS kind,
                        greatest(toUInt64OrZero(metadata.value[indexOf(metadata.key, 'delta')]), 1) AS delta
                    FROM recent_events
                    PREWHERE ts >= @since AND ts <= @until
                        AND check IN (SELECT arrayJoin(arrayConcat(@state_checks, @counter_checks)))
                    WHERE cityHash64(cluster, node) IN (SELECT cityHash64(cluster, node) FROM triggers)
                        AND ((has(@state_checks, check) AND match(entity, '(^|,)NICPort='))
                            OR (has(@counter_checks, check) AND has(error_codes, 'link_downed')))
                    UNION ALL
                    SELECT cityHash64(cluster, node, entity) AS gh, id, toUInt64(ts) * 1000 + ts_ms AS t,
                        toUInt8(multiIf(has(@counter_checks, check), 2, is_healthy = 1, 0, is_fatal = 1, 1, 3)) AS kind,
                        greatest(toUInt64OrZero(metadata.value[indexOf(metadata.key, 'delta')]), 1) AS delta
                    FROM batch
                    WHERE derived_by = '' AND processing_strategy != 'STORE_ONLY'
                        AND ((has(@state_checks, check) AND has(entities.type, 'NICPort'))
                            OR (has(@counter_checks, check) AND has(error_codes, 'link_downed')))
                )
                LIMIT 1 BY id
            )
            GROUP BY gh
        )
    )
    ARRAY JOIN rs AS r
) AS w USING (gh)
WHERE t > at_ms - @window_ms AND t <= at_ms
GROUP BY tid
