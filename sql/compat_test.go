package sql_test

import (
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/faultline/faultline/deploy/monitoring"
	"github.com/faultline/faultline/internal/analytics"
	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/internal/fleet"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/schemas/events"
	sqlfiles "github.com/faultline/faultline/sql"
)

// TestCurrentClickHouseAgrees runs every migration, every analytics query
// (several parameter sets each) and every correlation rule query (its
// cause and value passes, and its sweep candidates) on seeded data, on
// ClickHouse 18.16 (the real server) and on a current engine (chdb-core,
// ClickHouse 26.9 in-process), and requires the same answers: the same
// column names, the same column types (the processors scan them into fixed
// Go types) and the same rows. The rules' external tables (triggers, batch,
// batch_actions) are created as tables on both, the same script runs on
// both, and parameters are bound into the text the way clickhouse-go
// binds them. The rule parameters come from the shipped rules file, so a
// new rule is checked as soon as it is configured; a query file no case
// covers fails the test.
func TestCurrentClickHouseAgrees(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse 18.16 and chdb-core")
	}
	began := time.Now()
	steps, checks := compatScript(t)
	srv := testenv.StartClickHouse(t)
	if _, err := srv.HTTPQuery("", "CREATE DATABASE compat"); err != nil {
		t.Fatal(err)
	}
	old := srv.RunSQLSteps(t, "compat", steps)
	oldVersion, _ := srv.HTTPQuery("", "SELECT version()")
	cur := testenv.RunChdb(t, steps)
	t.Logf("%d steps on ClickHouse %s and chdb %s in %s", len(steps), strings.TrimSpace(oldVersion), cur.Version, time.Since(began).Round(time.Millisecond))

	for _, s := range steps {
		if !s.Query {
			continue
		}
		o, c := old[s.Name], cur.Results[s.Name]
		switch {
		case o.Error != "" && c.Error != "":
			t.Errorf("%s fails on both engines:\n18.16: %s\ncurrent: %s", s.Name, o.Error, c.Error)
			continue
		case o.Error != "":
			t.Errorf("%s fails on 18.16: %s", s.Name, o.Error)
			continue
		case c.Error != "":
			t.Errorf("%s fails on the current engine (%s): %s", s.Name, cur.Version, c.Error)
			continue
		}
		ot, ct := parseTSV(t, o.Out), parseTSV(t, c.Out)
		ordered := checks[s.Name].ordered
		if diff := ot.diff(ct, ordered); diff != "" {
			t.Errorf("%s answers differ (18.16 vs current):\n%s", s.Name, diff)
		}
		if chk := checks[s.Name].check; chk != nil {
			if err := chk(ot); err != nil {
				t.Errorf("%s on 18.16: %v\n%s", s.Name, err, o.Out)
			}
		}
	}
}

// stepCheck is what the test asks of a query step besides agreement.
type stepCheck struct {
	// ordered: the rows' order is part of the answer (ORDER BY).
	ordered bool
	// check, when set, must accept the answer (so the seed exercises the
	// query: an empty answer would agree trivially).
	check func(tsv) error
}

// tsv is a TSVWithNamesAndTypes answer.
type tsv struct {
	names, types []string
	rows         []string
}

func parseTSV(t *testing.T, s string) tsv {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	if len(lines) < 2 {
		t.Fatalf("not TSVWithNamesAndTypes: %q", s)
	}
	return tsv{names: strings.Split(lines[0], "\t"), types: strings.Split(lines[1], "\t"), rows: lines[2:]}
}

func (a tsv) diff(b tsv, ordered bool) string {
	var out []string
	if !slices.Equal(a.names, b.names) {
		out = append(out, fmt.Sprintf("columns: %v vs %v", a.names, b.names))
	}
	if !slices.Equal(a.types, b.types) {
		out = append(out, fmt.Sprintf("types: %v vs %v", a.types, b.types))
	}
	ar, br := a.rows, b.rows
	if !ordered {
		ar, br = slices.Clone(ar), slices.Clone(br)
		sort.Strings(ar)
		sort.Strings(br)
	}
	if !slices.Equal(ar, br) {
		out = append(out, fmt.Sprintf("rows (%d vs %d):\n18.16:\n  %s\ncurrent:\n  %s", len(ar), len(br),
			strings.Join(ar, "\n  "), strings.Join(br, "\n  ")))
	}
	return strings.Join(out, "\n")
}

// column returns the values of the named column.
func (a tsv) column(name string) ([]string, error) {
	i := slices.Index(a.names, name)
	if i < 0 {
		return nil, fmt.Errorf("no column %s in %v", name, a.names)
	}
	var out []string
	for _, r := range a.rows {
		f := strings.Split(r, "\t")
		if i >= len(f) {
			return nil, fmt.Errorf("short row %q", r)
		}
		out = append(out, f[i])
	}
	return out, nil
}

// nonEmpty accepts an answer with at least one row.
func nonEmpty(a tsv) error {
	if len(a.rows) == 0 {
		return fmt.Errorf("no rows: the seed does not exercise this query")
	}
	return nil
}

// reaches accepts a rule answer where some evaluation holds (value >=
// threshold).
func reaches(threshold float64) func(tsv) error {
	return func(a tsv) error {
		vals, err := a.column("value")
		if err != nil {
			return err
		}
		for _, v := range vals {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return fmt.Errorf("value %q: %v", v, err)
			}
			if f >= threshold {
				return nil
			}
		}
		return fmt.Errorf("no evaluation holds (value >= %v) in %d rows: the seed must make the rule hold", threshold, len(vals))
	}
}

// candidatesCheck is what a rule's sweep candidates must answer over the
// seed: something, and for the NIC rules the ports and signatures whose
// non-fatal state events count as down (NVSentinel's, marked
// crossings-only) and not those that do not (faultline's nic check's,
// unmarked).
func candidatesCheck(rule string) func(tsv) error {
	want := map[string]struct{ has, hasNot []string }{
		"NICPortDrop":    {has: []string{"\tNIC=mlx5_2,NICPort=1\t", "\tNIC=mlx5_6,NICPort=1\t"}, hasNot: []string{"\tNIC=mlx5_4,NICPort=1\t"}},
		"FabricIncident": {has: []string{"gamma\t\tInfiniBandStateCheck|\t"}, hasNot: []string{"gamma\t\tEthernetStateCheck|\t"}},
	}[rule]
	return func(a tsv) error {
		if err := nonEmpty(a); err != nil {
			return err
		}
		all := strings.Join(a.rows, "\n") + "\n"
		for _, h := range want.has {
			if !strings.Contains(all, h) {
				return fmt.Errorf("no candidate row holds %q", h)
			}
		}
		for _, h := range want.hasNot {
			if strings.Contains(all, h) {
				return fmt.Errorf("a candidate row holds %q", h)
			}
		}
		return nil
	}
}

// --------------------------------------------------------------- the seed

// t0 is the seed's epoch.
var t0 = time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)

type entity struct{ typ, value string }

// seedEvent is one HealthEvent row, with the columns the SQL reads.
type seedEvent struct {
	id, cluster, node, check string
	ents                     []entity
	at                       time.Time
	fatal, healthy           bool
	codes                    []string
	meta                     [][2]string
	strategy                 string // default EXECUTE_REMEDIATION
	derivedBy                string
	causes                   []string
}

func (e seedEvent) entityKey() string {
	parts := make([]string, len(e.ents))
	for i, en := range e.ents {
		parts[i] = en.typ + "=" + en.value
	}
	return strings.Join(parts, ",")
}

type seedAction struct {
	id, cluster, node, role, kind, outcome, rule string
	at                                           time.Time
	dryRun                                       bool
	nodeCreated                                  time.Time // details nodeCreated when set
}

// details are the action's details keys and values.
func (a seedAction) details() (keys, values []string) {
	if a.nodeCreated.IsZero() {
		return []string{"k"}, []string{"v"}
	}
	return []string{"k", "nodeCreated"}, []string{"v", a.nodeCreated.UTC().Format(time.RFC3339)}
}

func gpu(pci, uuid string) []entity { return []entity{{"PCI", pci}, {"GPU", uuid}} }
func port(nic string) []entity      { return []entity{{"NIC", nic}, {"NICPort", "1"}} }

// seed returns the events stored (a few twice, as a store retry writes
// them), the events only in the correlator's batch (one also stored), the
// actions stored, and the actions only in the batch (one also stored). Every rule and analytics query finds something in it.
func seed() (stored, batch []seedEvent, actions, batchActions []seedAction) {
	s := func(d time.Duration) time.Time { return t0.Add(d) }
	id := 0
	ev := func(e seedEvent) seedEvent {
		id++
		if e.id == "" {
			e.id = fmt.Sprintf("e%03d", id)
		}
		if e.cluster == "" {
			e.cluster = "alpha"
		}
		return e
	}
	var all []seedEvent
	add := func(es ...seedEvent) {
		for _, e := range es {
			all = append(all, ev(e))
		}
	}
	ib, ibDeg, xid, sxid, fm := "InfiniBandStateCheck", "InfiniBandDegradationCheck", "SysLogsXIDError", "SysLogsSXIDError", "FabricManagerNVSwitchError"
	// crossings: the mark nvsentinel.Normalize gives NVSentinel's NIC port
	// state events (its monitor reports no escalation to DOWN, so its
	// non-fatal event is a down; faultline's nic check, unmarked, does).
	crossings := [][2]string{{events.MetaNICCrossingsOnly, "1"}}
	// RepeatedNICLinkFlap: a port going down three times in two minutes
	// (state check and link_downed counter), recovering in between; its
	// first DOWN reported again (a second source) is no second down, nor
	// is the nic check's error recovery (non-fatal, unmarked) before a DOWN.
	// mlx5_5 is NVSentinel's: error recovery (non-fatal, marked: a down)
	// three times, back in between.
	add(
		seedEvent{node: "n-flap", check: ib, ents: port("mlx5_0"), at: s(0), fatal: true},
		seedEvent{node: "n-flap", check: ib, ents: port("mlx5_0"), at: s(2 * time.Second), fatal: true},
		seedEvent{node: "n-flap", check: ib, ents: port("mlx5_0"), at: s(30 * time.Second), healthy: true},
		seedEvent{node: "n-flap", check: ib, ents: port("mlx5_0"), at: s(60 * time.Second)},
		seedEvent{node: "n-flap", check: ib, ents: port("mlx5_0"), at: s(60*time.Second + 250*time.Millisecond), fatal: true},
		seedEvent{node: "n-flap", check: ibDeg, ents: port("mlx5_0"), at: s(61 * time.Second), codes: []string{"link_downed"}, meta: [][2]string{{"delta", "2"}}},
		seedEvent{node: "n-flap", check: ib, ents: port("mlx5_0"), at: s(90 * time.Second), healthy: true},
		seedEvent{node: "n-flap", check: ibDeg, ents: port("mlx5_0"), at: s(121 * time.Second), codes: []string{"link_downed", "symbol_error"}},
		seedEvent{node: "n-flap", check: ib, ents: port("mlx5_1"), at: s(5 * time.Minute), fatal: true},
		seedEvent{node: "n-flap", check: ib, ents: port("mlx5_5"), at: s(10 * time.Second), meta: crossings},
		seedEvent{node: "n-flap", check: ib, ents: port("mlx5_5"), at: s(20 * time.Second), healthy: true},
		seedEvent{node: "n-flap", check: ib, ents: port("mlx5_5"), at: s(70 * time.Second), meta: crossings},
		seedEvent{node: "n-flap", check: ib, ents: port("mlx5_5"), at: s(80 * time.Second), healthy: true},
		seedEvent{node: "n-flap", check: ib, ents: port("mlx5_5"), at: s(130 * time.Second), meta: crossings},
	)
	// NICPortDrop: mlx5_2 goes down and stays down (its own link_downed
	// inside grace); mlx5_3 goes down and retrains later (a flap, not a
	// drop); mlx5_4 sits in INIT (the nic check's, non-fatal: waiting for
	// the subnet manager, not down); mlx5_6 is caught in error recovery by
	// NVSentinel's monitor (marked crossings-only) and stays down (a drop).
	add(
		seedEvent{node: "n-drop", check: ib, ents: port("mlx5_2"), at: s(0), fatal: true},
		seedEvent{node: "n-drop", check: ibDeg, ents: port("mlx5_2"), at: s(5 * time.Second), codes: []string{"link_downed"}},
		seedEvent{node: "n-drop", check: ib, ents: port("mlx5_4"), at: s(0)},
		seedEvent{node: "n-drop", check: ib, ents: port("mlx5_6"), at: s(0), meta: crossings},
		seedEvent{node: "n-drop", check: "EthernetStateCheck", ents: port("mlx5_3"), at: s(0), fatal: true},
		seedEvent{node: "n-drop", check: "EthernetDegradationCheck", ents: port("mlx5_3"), at: s(2 * time.Minute), codes: []string{"link_downed"}, meta: [][2]string{{"delta", "1"}}},
	)
	// RepeatedXIDOnSameGPU: fatal Xid 48s in separate bursts (gap 3m), a
	// sticky Xid 79 that holds its burst open; Xid 31 for the count rule.
	g1, g2 := gpu("0000:3b:00.0", "GPU-1111"), gpu("0000:5e:00.0", "GPU-2222")
	for i, d := range []time.Duration{0, time.Minute, 10 * time.Minute, 30 * time.Minute, 50 * time.Minute, 70 * time.Minute, 90 * time.Minute, 200 * time.Minute} {
		code := "XID-48" // not sticky: a burst ends after 3m
		if i == 6 {
			code = "XID-79"
		}
		add(seedEvent{node: "n-xid", check: xid, ents: g1, at: s(d + time.Duration(i)*time.Millisecond), fatal: true, codes: []string{code}})
	}
	add(
		seedEvent{node: "n-xid", check: xid, ents: g2, at: s(5 * time.Minute), codes: []string{"XID-31"}, meta: [][2]string{{"count", "3"}}},
		seedEvent{node: "n-xid", check: xid, ents: g2, at: s(15 * time.Minute), codes: []string{"XID-31"}},
		seedEvent{node: "n-xid", check: xid, ents: g2, at: s(16 * time.Minute), codes: []string{"XID-13"}},
	)
	// FabricIncident: one SXid on five nodes of alpha within a minute; two
	// nodes of beta (below the threshold).
	for i := range 5 {
		add(seedEvent{node: fmt.Sprintf("f%d", i), check: sxid, ents: []entity{{"NVSwitch", "0"}}, at: s(time.Duration(10+10*i) * time.Second), fatal: true, codes: []string{"SXID-12028"}})
	}
	for i := range 2 {
		add(seedEvent{cluster: "beta", node: fmt.Sprintf("b%d", i), check: fm, ents: []entity{{"NVSwitch", "1"}}, at: s(time.Duration(20*i) * time.Second), codes: []string{"SXID-12028"}})
	}
	// ... and four nodes of gamma whose port NVSentinel's monitor caught in
	// error recovery (non-fatal, marked crossings-only: counted), four more
	// whose port faultline's nic check did (unmarked: not counted).
	for i := range 4 {
		add(seedEvent{cluster: "gamma", node: fmt.Sprintf("g%d", i), check: ib, ents: port("mlx5_0"), at: s(time.Duration(5+10*i) * time.Second), meta: crossings},
			seedEvent{cluster: "gamma", node: fmt.Sprintf("g%d", 4+i), check: "EthernetStateCheck", ents: port("mlx5_1"), at: s(time.Duration(5+10*i) * time.Second)})
	}
	// NVSwitchSXidGPUXid: a fatal SXid naming GPU-3333 and its Xid 74; a
	// non-fatal SXid 11004 naming GPU-4444 only by gpu_pci, and its Xid 45;
	// an Xid 45 with no SXid on GPU-5555.
	add(
		seedEvent{node: "n-sx", check: sxid, ents: []entity{{"NVSwitch", "2"}, {"GPU", "GPU-3333"}}, at: s(20 * time.Second), fatal: true, codes: []string{"SXID-24007"}, meta: [][2]string{{"gpu_pci", "0000:18:00.0"}}},
		seedEvent{node: "n-sx", check: xid, ents: gpu("0000:18:00.0", "GPU-3333"), at: s(40 * time.Second), fatal: true, codes: []string{"XID-74"}},
		seedEvent{node: "n-sx", check: fm, ents: []entity{{"NVSwitch", "3"}}, at: s(50 * time.Second), codes: []string{"SXID-11004"}, meta: [][2]string{{"gpu_pci", "0000:19:00.0"}}},
		seedEvent{node: "n-sx", check: xid, ents: gpu("0000:19:00.0", "GPU-4444"), at: s(70 * time.Second), fatal: true, codes: []string{"XID-45"}},
		seedEvent{node: "n-sx", check: xid, ents: gpu("0000:1a:00.0", "GPU-5555"), at: s(80 * time.Second), fatal: true, codes: []string{"XID-45"}},
	)
	// Left out of recent_events: a STORE_ONLY event and derived events
	// (which derived_events keeps); a healthy Xid check.
	add(
		seedEvent{node: "n-xid", check: xid, ents: g1, at: s(95 * time.Minute), fatal: true, codes: []string{"XID-79"}, strategy: "STORE_ONLY"},
		seedEvent{node: "n-xid", check: "RepeatedXIDOnSameGPU", ents: g1, at: s(91 * time.Minute), fatal: true, derivedBy: "RepeatedXIDOnSameGPU",
			meta: [][2]string{{"mode", "live"}, {"group", g1[0].typ + "=" + g1[0].value + ",GPU=GPU-1111"}}, causes: []string{"e008", "e009"}},
		seedEvent{node: "n-xid", check: "RepeatedXIDOnSameGPU", ents: g1, at: s(300 * time.Minute), healthy: true, derivedBy: "RepeatedXIDOnSameGPU",
			meta: [][2]string{{"mode", "live"}}},
		seedEvent{cluster: "beta", node: "b0", check: xid, ents: gpu("0000:3b:00.0", "GPU-9999"), at: s(-25 * time.Hour), healthy: true},
	)
	// A Node object kept across a machine swap: the windows count only the
	// trigger's machine's events (and those that name none).
	old, swapped := [][2]string{{events.MetaSystemUUID, "M-OLD"}}, [][2]string{{events.MetaSystemUUID, "M-NEW"}}
	add(
		seedEvent{node: "n-swap", check: xid, ents: g1, at: s(0), codes: []string{"XID-31"}, meta: old},
		seedEvent{node: "n-swap", check: xid, ents: g1, at: s(time.Minute), codes: []string{"XID-31"}, meta: old},
		seedEvent{node: "n-swap", check: xid, ents: g1, at: s(2 * time.Minute), codes: []string{"XID-31"}},
		seedEvent{node: "n-swap", check: xid, ents: g1, at: s(3 * time.Minute), codes: []string{"XID-31"}, meta: swapped},
		seedEvent{node: "n-swap", check: ib, ents: port("mlx5_0"), at: s(0), meta: old},
		seedEvent{node: "n-swap", check: ib, ents: port("mlx5_0"), at: s(time.Minute), meta: swapped},
		seedEvent{node: "n-swap", check: ib, ents: port("mlx5_0"), at: s(2 * time.Minute), healthy: true, meta: swapped},
		seedEvent{node: "n-swap", check: ib, ents: port("mlx5_0"), at: s(3 * time.Minute), meta: swapped},
	)
	// The batch: the last link_downed of the flapping port, the fifth
	// fabric node and GPU-4444's Xid 45 are not stored yet; the first flap
	// event is in both.
	inBatch := map[int]bool{0: true, 5: true, 26: true, 32: true}
	for i, e := range all {
		if inBatch[i] {
			batch = append(batch, e)
		}
		if !inBatch[i] || i == 0 {
			stored = append(stored, e)
		}
	}
	// A store retry writes some rows twice.
	stored = append(stored, stored[3], stored[10], stored[20])

	act := 0
	a := func(x seedAction) {
		act++
		x.id = fmt.Sprintf("a%03d", act)
		if x.cluster == "" {
			x.cluster = "alpha"
		}
		actions = append(actions, x)
	}
	// MultipleRemediations: six remediations of n-rem in a week, one
	// failed; quarantines for quarantined_longest. n-rem2's machine was
	// replaced (a new Node under its name) after its first three.
	for i := range 6 {
		a(seedAction{node: "n-rem", role: "remediate", kind: "remediate", outcome: "applied", rule: "reboot", at: s(-time.Duration(i) * 20 * time.Hour)})
		a(seedAction{node: "n-rem2", role: "remediate", kind: "remediate", outcome: "applied", rule: "reboot", at: s(-time.Duration(i) * 20 * time.Hour)})
	}
	a(seedAction{node: "n-rem2", role: "quarantine", kind: "quarantine", outcome: "applied", rule: "xid", at: s(-90 * time.Hour), nodeCreated: s(-200 * time.Hour)})
	a(seedAction{node: "n-rem2", role: "quarantine", kind: "quarantine", outcome: "applied", rule: "xid", at: s(-45 * time.Hour), nodeCreated: s(-50 * time.Hour)})
	a(seedAction{node: "n-rem2", role: "quarantine", kind: "unquarantine", outcome: "applied", rule: "xid", at: s(-39 * time.Hour)})
	a(seedAction{node: "n-rem", role: "remediate", kind: "remediate", outcome: "failed", rule: "reboot", at: s(-time.Hour)})
	a(seedAction{node: "n-xid", role: "quarantine", kind: "quarantine", outcome: "applied", rule: "xid", at: s(-2 * time.Hour)})
	a(seedAction{node: "n-xid", role: "quarantine", kind: "unquarantine", outcome: "applied", rule: "xid", at: s(-30 * time.Minute)})
	a(seedAction{node: "n-flap", role: "quarantine", kind: "quarantine", outcome: "dry_run", rule: "nic", at: s(-3 * time.Hour), dryRun: true})
	a(seedAction{cluster: "beta", node: "b1", role: "drain", kind: "drain", outcome: "succeeded", rule: "xid", at: s(-50 * time.Hour)})
	// The fleet page's drifted nodes: n-drift drifted, n-conf drifted and restored.
	a(seedAction{node: "n-drift", role: "conformance", kind: "conformance_drift", outcome: "applied", at: s(-4 * time.Hour)})
	a(seedAction{node: "n-conf", role: "conformance", kind: "conformance_drift", outcome: "applied", at: s(-4 * time.Hour)})
	a(seedAction{node: "n-conf", role: "conformance", kind: "conformance_restored", outcome: "applied", at: s(-3 * time.Hour)})
	a(seedAction{node: "n-rem", role: "remediate", kind: "remediate", outcome: "applied", rule: "reboot", at: s(10 * time.Minute)})
	batchActions = []seedAction{actions[len(actions)-1], actions[0]}
	actions = append(actions[:len(actions)-1], actions[0])
	return stored, batch, actions, batchActions
}

// ------------------------------------------------------------ SQL literals

// quote is a ClickHouse string literal, escaped as clickhouse-go does.
func quote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`, "\x00", `\0`).Replace(s) + "'"
}

func strArray(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = quote(s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

func dateTime(t time.Time) string { return quote(t.UTC().Format("2006-01-02 15:04:05")) }

// literal formats a parameter value as clickhouse-go's client-side binding
// does for a UTC server (bind.go: formatValue).
func literal(v any) (string, error) {
	switch v := v.(type) {
	case string:
		return quote(v), nil
	case []string:
		return strArray(v), nil
	case []any:
		parts := make([]string, len(v))
		for i, x := range v {
			s, err := literal(x)
			if err != nil {
				return "", err
			}
			parts[i] = s
		}
		return "[" + strings.Join(parts, ", ") + "]", nil
	case time.Time:
		return "toDateTime(" + dateTime(v) + ")", nil
	case float64:
		return fmt.Sprintf("cast(%s, 'Float64')", strconv.FormatFloat(v, 'g', -1, 64)), nil
	case uint64:
		return strconv.FormatUint(v, 10), nil
	case int64:
		return strconv.FormatInt(v, 10), nil
	case int:
		return strconv.Itoa(v), nil
	}
	return "", fmt.Errorf("no literal for %T", v)
}

// bind replaces @name outside quotes and comments with the literal of the
// named argument, as clickhouse-go's client-side binding does.
func bind(sql string, args map[string]any) (string, error) {
	var b strings.Builder
	for i := 0; i < len(sql); i++ {
		c := sql[i]
		switch {
		case c == '-' && i+1 < len(sql) && sql[i+1] == '-':
			end := strings.IndexByte(sql[i:], '\n')
			if end < 0 {
				end = len(sql) - i
			}
			b.WriteString(sql[i : i+end])
			i += end - 1
		case c == '\'':
			j := i + 1
			for j < len(sql) && sql[j] != '\'' {
				if sql[j] == '\\' {
					j++
				}
				j++
			}
			b.WriteString(sql[i:min(j+1, len(sql))])
			i = j
		case c == '@' && i+1 < len(sql) && isName(sql[i+1]):
			j := i + 1
			for j < len(sql) && isName(sql[j]) {
				j++
			}
			v, ok := args[sql[i+1:j]]
			if !ok {
				return "", fmt.Errorf("no argument for @%s", sql[i+1:j])
			}
			lit, err := literal(v)
			if err != nil {
				return "", fmt.Errorf("@%s: %w", sql[i+1:j], err)
			}
			b.WriteString(lit)
			i = j - 1
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

func isName(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

func u8(v bool) string {
	if v {
		return "1"
	}
	return "0"
}

func splitMS(t time.Time) (string, string) {
	return dateTime(t), strconv.Itoa(t.Nanosecond() / int(time.Millisecond))
}

func eventsInsert(evs []seedEvent) string {
	var rows []string
	for _, e := range evs {
		ts, ms := splitMS(e.at)
		strategy := e.strategy
		if strategy == "" {
			strategy = "EXECUTE_REMEDIATION"
		}
		var et, evv, mk, mv []string
		for _, en := range e.ents {
			et, evv = append(et, en.typ), append(evv, en.value)
		}
		for _, kv := range e.meta {
			mk, mv = append(mk, kv[0]), append(mv, kv[1])
		}
		rows = append(rows, fmt.Sprintf("(%s, %s, %s, %s, %s, %s, %s, %s, %s, 0, 1, 'seed', 'GPU', %s, %s, %s, 'NONE', '', %s, %s, %s, %s, %s, 0, 0, 0, 0, 0, 0, %s, %s, %s, 'seed', 'SUBMITTER_ROLE_AGENT', %s)",
			quote(e.cluster), quote(e.node), quote(e.check), quote(e.entityKey()), ts, ms, quote(e.id), ts, ms,
			u8(e.fatal), u8(e.healthy), quote(e.check+" on "+e.node), strArray(e.codes), strArray(et), strArray(evv), strArray(mk), strArray(mv),
			quote(strategy), quote(e.derivedBy), strArray(e.causes), quote(e.node)))
	}
	return `INSERT INTO events (cluster, node, check, entity, ts, ts_ms, id, received, received_ms, ts_missing,
	version, agent, component_class, is_fatal, is_healthy, message, recommended_action,
	custom_recommended_action, error_codes, entities.type, entities.value, metadata.key,
	metadata.value, quarantine_set, quarantine_force, quarantine_skip, drain_set, drain_force,
	drain_skip, processing_strategy, derived_by, cause_ids, submitter_name, submitter_role,
	submitter_node) VALUES ` + strings.Join(rows, ",\n")
}

func actionsInsert(as []seedAction) string {
	var rows []string
	for _, a := range as {
		ts, ms := splitMS(a.at)
		dk, dv := a.details()
		rows = append(rows, fmt.Sprintf("(%s, %s, %s, %s, %s, %s, %s, %s, 'because', %s, [], %s, %s, %s, 'c', 'NONE', %s)",
			quote(a.cluster), quote(a.node), ts, ms, quote(a.id), quote(a.role), quote(a.kind), quote(a.outcome), quote(a.rule), u8(a.dryRun),
			strArray(dk), strArray(dv), ts))
	}
	return `INSERT INTO actions (cluster, node, ts, ts_ms, id, role, kind, outcome, reason, rule, event_ids, dry_run,
	details.key, details.value, check, recommended_action, received) VALUES ` + strings.Join(rows, ",\n")
}

// The rules' external tables, as processors/correlate sends them (batch and
// batch_actions carry the events and actions tables' own column names).
const (
	triggersDDL = `CREATE TABLE triggers (tid String, cluster String, node String, gkey String, at DateTime, at_ms UInt64,
	machine String) ENGINE = Memory`
	batchDDL = `CREATE TABLE batch (cluster String, node String, check String, entity String, ts DateTime, ts_ms UInt16, id String,
	is_fatal UInt8, is_healthy UInt8, error_codes Array(String), "entities.type" Array(String), "entities.value" Array(String),
	"metadata.key" Array(String), "metadata.value" Array(String), derived_by String, processing_strategy String) ENGINE = Memory`
	batchActionsDDL = `CREATE TABLE batch_actions (cluster String, node String, ts DateTime, ts_ms UInt16, id String,
	kind String, outcome String, role String, rule String, dry_run UInt8, "details.key" Array(String), "details.value" Array(String)) ENGINE = Memory`
)

func batchInsert(evs []seedEvent) string {
	var rows []string
	for _, e := range evs {
		ts, ms := splitMS(e.at)
		strategy := e.strategy
		if strategy == "" {
			strategy = "EXECUTE_REMEDIATION"
		}
		var et, evv, mk, mv []string
		for _, en := range e.ents {
			et, evv = append(et, en.typ), append(evv, en.value)
		}
		for _, kv := range e.meta {
			mk, mv = append(mk, kv[0]), append(mv, kv[1])
		}
		rows = append(rows, fmt.Sprintf("(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
			quote(e.cluster), quote(e.node), quote(e.check), quote(e.entityKey()), ts, ms, quote(e.id), u8(e.fatal), u8(e.healthy),
			strArray(e.codes), strArray(et), strArray(evv), strArray(mk), strArray(mv), quote(e.derivedBy), quote(strategy)))
	}
	return "INSERT INTO batch VALUES " + strings.Join(rows, ",\n")
}

func batchActionsInsert(as []seedAction) string {
	var rows []string
	for _, a := range as {
		ts, ms := splitMS(a.at)
		dk, dv := a.details()
		rows = append(rows, fmt.Sprintf("(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
			quote(a.cluster), quote(a.node), ts, ms, quote(a.id), quote(a.kind), quote(a.outcome), quote(a.role), quote(a.rule), u8(a.dryRun),
			strArray(dk), strArray(dv)))
	}
	return "INSERT INTO batch_actions VALUES " + strings.Join(rows, ",\n")
}

// trigger is one evaluation of a rule.
type trigger struct {
	cluster, node, gkey string
	at                  time.Time
	machine             string
}

func triggersInsert(ts []trigger) string {
	var rows []string
	for i, t := range ts {
		rows = append(rows, fmt.Sprintf("('%d', %s, %s, %s, %s, %d, %s)", i, quote(t.cluster), quote(t.node), quote(t.gkey),
			dateTime(t.at.Truncate(time.Second)), t.at.UnixMilli(), quote(t.machine)))
	}
	return "INSERT INTO triggers VALUES " + strings.Join(rows, ",\n")
}

// ------------------------------------------------------------- the script

// ruleSpec is the part of a processors/correlate rule the SQL needs.
type ruleSpec struct {
	Name       string         `toml:"name"`
	Source     string         `toml:"source"`
	Scope      string         `toml:"scope"`
	Window     string         `toml:"window"`
	Query      string         `toml:"query"`
	Candidates string         `toml:"candidates"`
	Threshold  float64        `toml:"threshold"`
	Params     map[string]any `toml:"params"`
	Durations  map[string]any `toml:"durations"`
}

// shippedRules reads the rules file processors/correlate ships.
func shippedRules(t *testing.T) []ruleSpec {
	t.Helper()
	var f struct {
		Rule []ruleSpec `toml:"rule"`
	}
	if _, err := toml.DecodeFile(filepath.Join("..", "processors", "correlate", "default_rules.toml"), &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Rule) == 0 {
		t.Fatal("no rules in default_rules.toml")
	}
	return f.Rule
}

// triggersFor returns a rule's evaluations over the seed, as the
// correlator makes them: one per relevant event at its time (its group by
// the rule's scope, the event's machine) and each group again later (as
// a sweep would: no machine).
func triggersFor(r ruleSpec, evs []seedEvent, acts []seedAction) []trigger {
	var out []trigger
	seen := map[string]bool{}
	addGroup := func(t trigger) {
		out = append(out, t)
		k := t.cluster + "\x00" + t.node + "\x00" + t.gkey
		if !seen[k] {
			seen[k] = true
			for _, later := range []time.Duration{3 * time.Minute, 10 * time.Minute, 3 * time.Hour} {
				out = append(out, trigger{cluster: t.cluster, node: t.node, gkey: t.gkey, at: t.at.Add(later)})
			}
		}
	}
	if r.Source == "actions" {
		for _, a := range acts {
			addGroup(trigger{cluster: a.cluster, node: a.node, at: a.at})
		}
		return out
	}
	for _, e := range evs {
		if e.derivedBy != "" {
			continue
		}
		machine := ""
		for _, kv := range e.meta {
			if kv[0] == events.MetaSystemUUID {
				machine = kv[1]
			}
		}
		switch r.Scope {
		case "entity":
			addGroup(trigger{cluster: e.cluster, node: e.node, gkey: e.entityKey(), at: e.at, machine: machine})
		case "node":
			addGroup(trigger{cluster: e.cluster, node: e.node, at: e.at, machine: machine})
		case "cluster":
			code := ""
			if len(e.codes) > 0 {
				code = e.codes[0]
			}
			addGroup(trigger{cluster: e.cluster, gkey: e.check + "|" + code, at: e.at, machine: machine})
		}
	}
	return out
}

// ruleArgs binds a rule's parameters as processors/correlate does.
func ruleArgs(t *testing.T, r ruleSpec, window time.Duration, since, until time.Time) map[string]any {
	t.Helper()
	args := map[string]any{
		"window_ms": uint64(window.Milliseconds()),
		"since":     since, "until": until, "threshold": r.Threshold,
	}
	for k, v := range r.Params {
		args[k] = v
	}
	for k, v := range r.Durations {
		d, err := time.ParseDuration(fmt.Sprint(v))
		if err != nil {
			t.Fatalf("rule %s: durations.%s: %v", r.Name, k, err)
		}
		args[k+"_ms"] = uint64(d.Milliseconds())
	}
	return args
}

// valuePass is how processors/correlate runs a rule query without causes.
func valuePass(q string) string {
	return "SELECT tid, value, emptyArrayString() AS cause_ids, last_ms FROM (" + q + "\n)"
}

func compatScript(t *testing.T) ([]testenv.SQLStep, map[string]stepCheck) {
	t.Helper()
	var steps []testenv.SQLStep
	checks := map[string]stepCheck{}
	exec := func(name, sql string) { steps = append(steps, testenv.SQLStep{Name: name, SQL: sql}) }
	query := func(name, sql string, c stepCheck) {
		steps = append(steps, testenv.SQLStep{Name: name, SQL: sql, Query: true})
		checks[name] = c
	}

	// Every migration, statement by statement.
	migs, err := clickhouse.LoadMigrations(sqlfiles.Migrations, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range migs {
		for i, s := range m.Statements {
			exec(fmt.Sprintf("%s#%d", m.File, i+1), s)
		}
	}
	stored, batch, acts, batchActs := seed()
	exec("seed events", eventsInsert(stored))
	exec("seed actions", actionsInsert(acts))

	// The schema and what the views copied.
	query("schema", `SELECT table, name, type FROM system.columns WHERE database = currentDatabase() AND table NOT IN ('triggers', 'batch', 'batch_actions') ORDER BY table, name`,
		stepCheck{ordered: true, check: nonEmpty})
	query("tables", `SELECT name, engine FROM system.tables WHERE database = currentDatabase() ORDER BY name`, stepCheck{ordered: true, check: nonEmpty})
	for table, cols := range map[string]string{
		"events":         "cluster, node, check, entity, ts, ts_ms, id, received, is_fatal, is_healthy, error_codes, entities.type, entities.value, metadata.key, metadata.value, processing_strategy, derived_by, cause_ids, submitter_role",
		"recent_events":  "cluster, node, check, entity, ts, ts_ms, id, received, is_fatal, is_healthy, error_codes, entities.type, entities.value, metadata.key, metadata.value, processing_strategy, derived_by",
		"derived_events": "cluster, node, check, entity, ts, ts_ms, id, received, is_healthy, entities.type, entities.value, metadata.key, metadata.value, derived_by",
		"actions":        "cluster, node, ts, ts_ms, id, role, kind, outcome, reason, rule, event_ids, dry_run, details.key, details.value",
	} {
		query("table "+table, "SELECT "+cols+" FROM "+table+" ORDER BY id LIMIT 1 BY id", stepCheck{ordered: true, check: nonEmpty})
	}

	// Every analytics query, with the parameter sets its test uses.
	qs, err := analytics.Builtin()
	if err != nil {
		t.Fatal(err)
	}
	now := t0.Add(24 * time.Hour)
	day := map[string]string{"since": "2026-03-01", "until": "2026-03-03"}
	with := func(p map[string]string, kv ...string) map[string]string {
		out := map[string]string{}
		for k, v := range p {
			out[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	flapPort := map[string]string{"cluster": "alpha", "node": "n-flap", "check": "InfiniBandStateCheck", "entity": "NIC=mlx5_0,NICPort=1", "until": "2026-03-02 10:05:00"}
	xidGPU := map[string]string{"cluster": "alpha", "node": "n-xid", "check": "SysLogsXIDError", "until": "2026-03-02 18:00:00"}
	cases := []struct {
		query  string
		params map[string]string
		check  func(tsv) error
	}{
		{"events_per_day", day, nonEmpty},
		{"events_per_day", with(day, "cluster", "beta"), nonEmpty},
		{"top_error_codes", day, nonEmpty},
		{"top_error_codes", with(day, "prefix", "SXID-", "limit", "1"), nonEmpty},
		{"flapping_nic_ports", with(day, "min_downs", "2"), nonEmpty},
		{"flapping_nic_ports", day, nil},
		{"mtbf_fatal", day, nonEmpty},
		{"quarantined_longest", map[string]string{}, nonEmpty},
		{"quarantined_longest", map[string]string{"cluster": "alpha", "limit": "1"}, nonEmpty},
		{"remediation_outcomes", with(day, "since", "2026-02-20"), nonEmpty},
		{"link_down_window", flapPort, nonEmpty},
		{"link_down_window", with(flapPort, "window", "45"), nonEmpty},
		{"xid_bursts", xidGPU, nonEmpty},
		{"xid_bursts", with(xidGPU, "gap", "1200"), nonEmpty},
		{"conformance_groups", map[string]string{"until": "2026-03-02 12:00:00"}, nil},
		{"conformance_groups", map[string]string{"until": "2026-03-02 12:00:00", "cluster": "alpha", "staleness": "3600"}, nil},
	}
	covered := map[string]bool{}
	for i, c := range cases {
		q, ok := qs[c.query]
		if !ok {
			t.Fatalf("no analytics query %s", c.query)
		}
		covered[c.query] = true
		named, err := q.Args(c.params, now)
		if err != nil {
			t.Fatalf("%s: %v", c.query, err)
		}
		args := map[string]any{}
		for _, a := range named {
			nv := a.(driver.NamedValue)
			args[nv.Name] = nv.Value
		}
		sql, err := bind(q.SQL, args)
		if err != nil {
			t.Fatalf("%s: %v", c.query, err)
		}
		query(fmt.Sprintf("analytics %s #%d %v", c.query, i, c.params), sql, stepCheck{ordered: true, check: c.check})
	}
	for name := range qs {
		if !covered[name] {
			t.Errorf("analytics query %s has no case here", name)
		}
	}

	// Every fleet page query (internal/fleet), as the page runs it.
	fq, err := fleet.Queries()
	if err != nil {
		t.Fatal(err)
	}
	alphaNow := map[string]string{"cluster": "alpha", "now": "2026-03-03 00:00:00"}
	fleetCases := []struct {
		query  string
		params map[string]string
		check  func(tsv) error
	}{
		{"node_states", alphaNow, nonEmpty},
		{"node_states", with(alphaNow, "node", "n-flap"), nonEmpty},
		{"state_counts", alphaNow, nonEmpty},
		{"node_page", with(alphaNow, "limit", "10"), nonEmpty},
		{"node_page", with(alphaNow, "state", "quarantined", "after_ms", "1772445660000", "after_node", "n-flap", "limit", "1"), nil},
		{"node_faults", with(alphaNow, "node", "n-flap"), nonEmpty},
		{"node_faults", with(alphaNow, "node", "n-xid"), nil},
		{"drifted", alphaNow, nonEmpty},
		{"cluster_state", with(day, "cluster", "alpha", "now", alphaNow["now"]), nonEmpty},
		{"cluster_state", with(day, "cluster", "nobody", "now", alphaNow["now"]), nonEmpty},
	}
	fleetCovered := map[string]bool{}
	for i, c := range fleetCases {
		q, ok := fq[c.query]
		if !ok {
			t.Fatalf("no fleet query %s", c.query)
		}
		fleetCovered[c.query] = true
		named, err := q.Args(c.params, now)
		if err != nil {
			t.Fatalf("%s: %v", c.query, err)
		}
		args := map[string]any{}
		for _, a := range named {
			nv := a.(driver.NamedValue)
			args[nv.Name] = nv.Value
		}
		sql, err := bind(q.SQL, args)
		if err != nil {
			t.Fatalf("%s: %v", c.query, err)
		}
		query(fmt.Sprintf("fleet %s #%d %v", c.query, i, c.params), sql, stepCheck{ordered: true, check: c.check})
	}
	for name := range fq {
		if !fleetCovered[name] {
			t.Errorf("fleet query %s has no case here", name)
		}
	}

	// Every SQL panel of the Grafana dashboards (deploy/monitoring), its
	// macros expanded as Grafana's ClickHouse plugin sends them.
	panels, err := monitoring.SQLPanels()
	if err != nil {
		t.Fatal(err)
	}
	if len(panels) == 0 {
		t.Error("no SQL panels found in deploy/monitoring")
	}
	for _, p := range panels {
		sql := monitoring.Expand(p.SQL, "alpha", time.Date(2026, 2, 20, 0, 0, 0, 0, time.UTC), time.Date(2026, 3, 3, 0, 0, 0, 0, time.UTC))
		check := nonEmpty
		if strings.Contains(p.Where, "flapping") {
			check = nil // the seed has no node quarantined twice
		}
		query("dashboard "+p.Where, sql, stepCheck{ordered: true, check: check})
	}

	// Every rule of the shipped rules file: triggers over the seed, the
	// batch, the cause and value passes and the candidates.
	exec("batch", batchDDL)
	exec("batch rows", batchInsert(batch))
	exec("batch_actions", batchActionsDDL)
	exec("batch_actions rows", batchActionsInsert(batchActs))
	usedFiles := map[string]bool{}
	readRule := func(file string) string {
		b, err := fs.ReadFile(sqlfiles.Rules, "rules/"+file)
		if err != nil {
			t.Fatalf("rule query %s: %v", file, err)
		}
		usedFiles[file] = true
		return string(b)
	}
	for _, r := range shippedRules(t) {
		window, err := time.ParseDuration(r.Window)
		if err != nil {
			t.Fatalf("rule %s: window: %v", r.Name, err)
		}
		trigs := triggersFor(r, append(slices.Clone(stored), batch...), append(slices.Clone(acts), batchActs...))
		if len(trigs) == 0 {
			t.Fatalf("rule %s: the seed gives it no triggers", r.Name)
		}
		minAt, maxAt := int64(math.MaxInt64), int64(0)
		for _, tr := range trigs {
			minAt, maxAt = min(minAt, tr.at.UnixMilli()), max(maxAt, tr.at.UnixMilli())
		}
		since := time.UnixMilli(minAt - window.Milliseconds()).UTC().Truncate(time.Second)
		until := time.UnixMilli(maxAt).UTC().Truncate(time.Second).Add(time.Second)
		args := ruleArgs(t, r, window, since, until)
		exec("triggers of "+r.Name, "DROP TABLE IF EXISTS triggers")
		exec("triggers table of "+r.Name, triggersDDL)
		exec("triggers rows of "+r.Name, triggersInsert(trigs))
		q, err := bind(readRule(r.Query), args)
		if err != nil {
			t.Fatalf("rule %s: %v", r.Name, err)
		}
		query("rule "+r.Name+" ("+r.Query+")", q, stepCheck{check: reaches(r.Threshold)})
		query("rule "+r.Name+" ("+r.Query+", value pass)", valuePass(q), stepCheck{check: reaches(r.Threshold)})
		if r.Candidates != "" {
			// The sweep's window: (now - window, now] at the seed's busiest time.
			at := t0.Add(90 * time.Second)
			cargs := ruleArgs(t, r, window, at.Add(-window), at.Add(time.Second))
			cq, err := bind(readRule(r.Candidates), cargs)
			if err != nil {
				t.Fatalf("rule %s candidates: %v", r.Name, err)
			}
			query("candidates "+r.Name+" ("+r.Candidates+")", cq, stepCheck{check: candidatesCheck(r.Name)})
		}
	}
	entries, err := fs.ReadDir(sqlfiles.Rules, "rules")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".sql") && !usedFiles[e.Name()] {
			t.Errorf("sql/rules/%s is not used by any rule of default_rules.toml, so it is not checked here", e.Name())
		}
	}
	if os.Getenv("FAULTLINE_COMPAT_DUMP") != "" {
		for _, s := range steps {
			t.Logf("-- %s\n%s;", s.Name, s.SQL)
		}
	}
	return steps, checks
}
