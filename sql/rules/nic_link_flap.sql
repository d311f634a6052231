-- RepeatedNICLinkFlap: link-down occurrences on one NIC port (gkey = the
-- port's entity key "NIC=mlx5_0,NICPort=1") in (at - window, at].
-- A link-down is a state-check event reporting the port unhealthy (the
-- healthy->unhealthy crossing) or a link_downed counter increase from the
-- degradation check. One real flap usually produces both (the state check
-- sees DOWN and the counter goes up), so the two are not added: the value is
-- max(state-check downs, sum of link_downed deltas), which also counts the
-- sub-second flaps only the counter sees.
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
    SELECT gh, id, t, down, delta
    FROM
    (
        SELECT cityHash64(cluster, node, entity) AS gh, id, toUInt64(ts) * 1000 + ts_ms AS t,
            toUInt8(has(@state_checks, check)) AS down,
            greatest(toUInt64OrZero(metadata.value[indexOf(metadata.key, 'delta')]), 1) AS delta
        FROM recent_events
        PREWHERE ts >= @since AND ts <= @until
            AND check IN (SELECT arrayJoin(arrayConcat(@state_checks, @counter_checks)))
        WHERE cityHash64(cluster, node) IN (SELECT cityHash64(cluster, node) FROM triggers)
            AND ((has(@state_checks, check) AND is_healthy = 0 AND match(entity, '(^|,)NICPort='))
                OR (has(@counter_checks, check) AND has(error_codes, 'link_downed')))
        UNION ALL
        SELECT cityHash64(cluster, node, entity) AS gh, id, toUInt64(ts) * 1000 + ts_ms AS t,
            toUInt8(has(@state_checks, check)) AS down,
            greatest(toUInt64OrZero(metadata.value[indexOf(metadata.key, 'delta')]), 1) AS delta
        FROM batch
        WHERE derived_by = '' AND processing_strategy != 'STORE_ONLY'
            AND ((has(@state_checks, check) AND is_healthy = 0 AND has(entities.type, 'NICPort'))
                OR (has(@counter_checks, check) AND has(error_codes, 'link_downed')))
    )
    LIMIT 1 BY id
) AS w USING (gh)
WHERE t > at_ms - @window_ms AND t <= at_ms
GROUP BY tid
