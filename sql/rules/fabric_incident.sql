-- FabricIncident: how many distinct nodes of one cluster reported the same
-- fault (gkey = the signature "checkName|firstErrorCode") fatal unhealthy
-- in (at - window, at]. Non-fatal events (a non-fatal SXid such as 20001,
-- informational per the Fabric Manager guide; a NIC port's transient INIT
-- or LinkErrorRecovery from faultline's nic check) make no incident: four
-- nodes' TX replays stood as one and suppressed the cluster's NIC rules.
-- A non-fatal NIC port state event marked crossings-only
-- (faultline.io/nic-crossings-only: NVSentinel's NIC monitor, which
-- reports no escalation to DOWN) counts, as it counts as a link-down in
-- nic_link_flap.sql and nic_port_drop.sql: the NIC rules it would fire on
-- every node are what the incident suppresses.
--
-- Evaluated per group in one sorted pass, not per trigger × event: a node
-- counts at `at` when one of its events t has t <= at < t + window, so each
-- node's events become intervals [t, t + window), merged where they touch
-- (a node's run of events no more than a window apart), and a trigger's value
-- is the number of intervals begun and not ended at its time. The group's
-- interval starts (+1), ends (-1) and trigger times (0) are sorted into
-- one array (at equal times starts and ends before triggers) whose running
-- sum (arrayCumSum) is each trigger's value; the same pass over the
-- group's event times (each the difference to the one before) gives each
-- trigger its newest event at or before it, last_ms when inside the
-- window. A fleet-wide fault has hundreds of nodes in the window and
-- thousands of triggers per batch: filtering the group's arrays per
-- trigger cost triggers × events (a batch of 20,000: 1.5 s a query, and
-- over 2 GB of memory at 50,000). Only cause_ids, asked for where a
-- verdict starts (few triggers), filters the group's events per trigger.
-- param: checks Array(String)        checks whose faults can be fabric-wide
-- param: state_checks Array(String)  NIC state-check names (their non-fatal port events marked crossings-only count)
SELECT
    tid,
    toFloat64(v) AS value,
    arraySlice(arraySort(arrayFilter((x, y) -> y > at_ms - @window_ms AND y <= at_ms, ids, ts)), 1, 100) AS cause_ids,
    if(newest > at_ms - @window_ms, toUInt64(newest), toUInt64(0)) AS last_ms
FROM
(
    SELECT tids, ats, ids, ts,
        -- keys: time * 2, + 1 for a trigger, so at equal times the
        -- events' entries sort before it
        arrayConcat(arrayMap(x -> x * 2, starts), arrayMap(x -> x * 2, ends), arrayMap(x -> x * 2 + 1, ats)) AS ikeys,
        arrayConcat(arrayMap(x -> toInt64(1), starts), arrayMap(x -> toInt64(-1), ends), arrayMap(x -> toInt64(0), ats)) AS ideltas,
        arrayConcat(arrayMap(x -> 0, starts), arrayMap(x -> 0, ends), arrayEnumerate(ats)) AS islots,
        arraySort((d, k) -> k, islots, ikeys) AS islots_sorted,
        arrayFilter((c, s) -> s > 0, arrayCumSum(arraySort((d, k) -> k, ideltas, ikeys)), islots_sorted) AS ivalues,
        arrayConcat(arrayMap(x -> x * 2, ts), arrayMap(x -> x * 2 + 1, ats)) AS ekeys,
        arrayConcat(arrayMap((x, p) -> toInt64(x) - toInt64(p), ts, arrayPushFront(arrayPopBack(ts), toUInt64(0))), arrayMap(x -> toInt64(0), ats)) AS edeltas,
        arrayConcat(arrayMap(x -> 0, ts), arrayEnumerate(ats)) AS eslots,
        arraySort((d, k) -> k, eslots, ekeys) AS eslots_sorted,
        arrayFilter((c, s) -> s > 0, arrayCumSum(arraySort((d, k) -> k, edeltas, ekeys)), eslots_sorted) AS enewest,
        -- back in the triggers' order
        arraySort((v, s) -> s, ivalues, arrayFilter(s -> s > 0, islots_sorted)) AS values,
        arraySort((v, s) -> s, enewest, arrayFilter(s -> s > 0, eslots_sorted)) AS newests
    FROM
    (
        SELECT gh, groupArray(tid) AS tids, groupArray(at_ms) AS ats
        FROM (SELECT tid, cityHash64(cluster, gkey) AS gh, at_ms FROM triggers)
        GROUP BY gh
    ) AS tr
    ALL INNER JOIN
    (
        SELECT gh, groupArrayArray(nstarts) AS starts, groupArrayArray(nends) AS ends,
            arraySort((i, x) -> x, groupArrayArray(nids), groupArrayArray(nraw)) AS ids, arraySort(groupArrayArray(nraw)) AS ts
        FROM
        (
            -- one node's events: its merged intervals' starts and ends
            SELECT gh, n, groupArray(id) AS nids, groupArray(t) AS nraw, arraySort(nraw) AS nts,
                arrayFilter((x, p) -> x > p + @window_ms, nts, arrayPushFront(arrayPopBack(nts), toUInt64(0))) AS nstarts,
                arrayMap(x -> x + @window_ms, arrayFilter((x, nx) -> nx > x + @window_ms, nts, arrayPushBack(arrayPopFront(nts), toUInt64(-1)))) AS nends
            FROM
            (
                SELECT gh, n, id, t
                FROM
                (
                    SELECT cityHash64(cluster, concat(check, '|', error_codes[1])) AS gh, cityHash64(node) AS n, id, toUInt64(ts) * 1000 + ts_ms AS t
                    FROM recent_events
                    PREWHERE check IN (SELECT arrayJoin(@checks)) AND ts >= @since AND ts <= @until
                    WHERE cluster IN (SELECT cluster FROM triggers) AND is_healthy = 0
                        AND (is_fatal = 1 OR (has(@state_checks, check) AND match(entity, '(^|,)NICPort=')
                            AND has(metadata.key, 'faultline.io/nic-crossings-only')))
                    UNION ALL
                    SELECT cityHash64(cluster, concat(check, '|', error_codes[1])) AS gh, cityHash64(node) AS n, id, toUInt64(ts) * 1000 + ts_ms AS t
                    FROM batch
                    WHERE has(@checks, check) AND is_healthy = 0
                        AND (is_fatal = 1 OR (has(@state_checks, check) AND has(entities.type, 'NICPort')
                            AND has(metadata.key, 'faultline.io/nic-crossings-only')))
                        AND derived_by = '' AND processing_strategy != 'STORE_ONLY'
                )
                LIMIT 1 BY id
            )
            GROUP BY gh, n
        )
        GROUP BY gh
    ) AS w USING (gh)
)
ARRAY JOIN tids AS tid, ats AS at_ms, values AS v, newests AS newest
WHERE v > 0
