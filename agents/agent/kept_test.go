//go:build linux

package agent

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// fillSpool fills a's spool with non-fatal events to its 90% mark, where
// it refuses non-fatal events but still takes fatal ones.
func fillSpool(t *testing.T, a *Agent) {
	t.Helper()
	for {
		n, err := a.Spool().Append([]*datamodels.HealthEvent{ev(strings.Repeat("y", 200), false)})
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
	}
}

// TestFatalNotBlockedBehindKeptNonFatal: the gateway is down and the spool
// past its 90% mark. The kmsg check reports non-fatal Xids, which the
// spool refuses (reserved for fatal events) and the runner keeps; each
// later run first tried the kept events again and, refused again,
// returned before running the check: the check stopped running until the
// backlog dropped below 80%, /dev/kmsg overwrote the fatal Xid unread,
// and the room kept for fatal events served nothing. The check must run
// on, its fatal event spooled ahead of the refused non-fatal ones, its
// state not saved; once the spool drains the non-fatal ones follow in
// order, and only then is its state saved.
func TestFatalNotBlockedBehindKeptNonFatal(t *testing.T) {
	cfg := testConfig(t, "127.0.0.1:1")
	cfg.Spool.MaxBytes = 16 << 10
	var a *Agent
	runs := 0
	reports := map[int]*datamodels.HealthEvent{
		1: {CheckName: "Xid", ComponentClass: "GPU", Message: "xid 13"},
		2: {CheckName: "Xid", ComponentClass: "GPU", Message: "xid 31"},
		3: {CheckName: "Xid", ComponentClass: "GPU", Message: "xid 79", IsFatal: true},
		4: {CheckName: "Xid", ComponentClass: "GPU", Message: "xid 43"},
	}
	c := &committingCheck{spool: func() *Spool { return a.Spool() }}
	c.fakeCheck = fakeCheck{"kmsg", func(context.Context) ([]*datamodels.HealthEvent, error) {
		runs++
		if e := reports[runs]; e != nil {
			return []*datamodels.HealthEvent{e}, nil
		}
		return nil, nil
	}}
	sched := Scheduled{Check: c, Interval: time.Minute, Timeout: time.Second}
	a, err := New(cfg, quiet(), Options{Checks: []Scheduled{sched}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Spool().Close()
	fillSpool(t, a)
	for range 5 {
		a.RunOnce(context.Background(), sched)
	}
	if runs != 5 {
		t.Errorf("the check ran %d times in 5 runs, want 5 (not held behind its refused non-fatal events)", runs)
	}
	if len(c.commits) != 0 {
		t.Errorf("state saved %v while events are kept", c.commits)
	}
	spooled := func() []string { // but the fill
		evs, _, err := a.Spool().Peek(1000)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, m := range msgs(evs) {
			if !strings.HasPrefix(m, "yyy") {
				out = append(out, m)
			}
		}
		return out
	}
	if got := strings.Join(spooled(), ","); got != "xid 79" {
		t.Fatalf("spooled after the fill: %q, want the fatal xid 79", got)
	}
	// xid 43, behind the refused ones, is not offered (nor counted) yet.
	if v := val(a.m.spoolDropped.WithLabelValues("reserved_for_fatal")); v != 2 {
		t.Errorf("spool_dropped_events_total{reserved_for_fatal} = %v, want 2 (each refused event once)", v)
	}
	// The gateway takes the backlog: the kept events follow, in order.
	_, next, _ := a.Spool().Peek(1000)
	if err := a.Spool().Commit(next); err != nil {
		t.Fatal(err)
	}
	a.RunOnce(context.Background(), sched)
	if got := strings.Join(spooled(), ","); got != "xid 13,xid 31,xid 43" {
		t.Errorf("spooled after draining: %q, want the kept non-fatal events in order", got)
	}
	if len(c.commits) == 0 {
		t.Error("state not saved once every kept event was spooled")
	}
}

// TestKeptEventsBounded: while the spool refuses a check's events, the
// check runs on and its events queue in memory behind the refused ones,
// up to keptMax bytes: past it the oldest non-fatal ones are dropped,
// counted in faultline_agent_kept_events_dropped_total{check}, and the
// newest follow in order once the spool drains.
func TestKeptEventsBounded(t *testing.T) {
	cfg := testConfig(t, "127.0.0.1:1")
	cfg.Spool.MaxBytes = 16 << 10
	var a *Agent
	runs := 0
	c := fakeCheck{"nic", func(context.Context) ([]*datamodels.HealthEvent, error) {
		runs++
		return []*datamodels.HealthEvent{{CheckName: "Port", ComponentClass: "NIC", Message: fmt.Sprintf("run %02d %s", runs, strings.Repeat("z", 400))}}, nil
	}}
	sched := Scheduled{Check: c, Interval: time.Minute, Timeout: time.Second}
	a, err := New(cfg, quiet(), Options{Checks: []Scheduled{sched}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Spool().Close()
	a.keptMax = 2 << 10 // four or so of these events
	fillSpool(t, a)
	for range 20 {
		a.RunOnce(context.Background(), sched)
	}
	dropped := val(a.m.keptDropped.WithLabelValues("nic"))
	if dropped < 10 {
		t.Fatalf("kept_events_dropped_total{check=nic} = %v after 20 refused runs with room for a few, want most", dropped)
	}
	_, next, _ := a.Spool().Peek(10000)
	if err := a.Spool().Commit(next); err != nil {
		t.Fatal(err)
	}
	a.RunOnce(context.Background(), sched) // run 21
	evs, _, _ := a.Spool().Peek(1000)
	var got []string
	for _, e := range evs {
		got = append(got, e.GetMessage()[:6])
	}
	want := []string{}
	for i := 21 - (20 - int(dropped)); i <= 21; i++ {
		want = append(want, fmt.Sprintf("run %02d", i))
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("spooled %v, want the newest kept, in order: %v", got, want)
	}
}

// drainSpool hands the gateway everything a's spool holds, and returns the
// messages of it that are not the fill.
func drainSpool(t *testing.T, a *Agent) []string {
	t.Helper()
	evs, next, err := a.Spool().Peek(100000)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Spool().Commit(next); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range msgs(evs) {
		if !strings.HasPrefix(m, "yyy") {
			out = append(out, strings.TrimRight(m, " z")) // the padding cut
		}
	}
	return out
}

// TestKeptRecoveryNotDropped: the gateway is down and the spool past its
// 90% mark; a check reports a recovery, then one flap after another, all
// refused and kept. Past keptMax the oldest kept events were dropped,
// whatever they were: the recovery went first, and the check's state,
// committed once the rest was spooled, never reported it again — the
// fault it lifts stood, the node stayed quarantined. Only non-fatal
// unhealthy events may be dropped: the recovery is spooled, first, once
// the spool drains.
func TestKeptRecoveryNotDropped(t *testing.T) {
	cfg := testConfig(t, "127.0.0.1:1")
	cfg.Spool.MaxBytes = 16 << 10
	var a *Agent
	runs := 0
	c := fakeCheck{"nic", func(context.Context) ([]*datamodels.HealthEvent, error) {
		runs++
		e := &datamodels.HealthEvent{CheckName: "Port", ComponentClass: "NIC", Message: fmt.Sprintf("flap %02d %s", runs, strings.Repeat("z", 400))}
		if runs == 1 {
			e.IsHealthy, e.Message = true, "recovered"
		}
		return []*datamodels.HealthEvent{e}, nil
	}}
	sched := Scheduled{Check: c, Interval: time.Minute, Timeout: time.Second}
	a, err := New(cfg, quiet(), Options{Checks: []Scheduled{sched}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Spool().Close()
	a.keptMax = 2 << 10
	fillSpool(t, a)
	for range 20 {
		a.RunOnce(context.Background(), sched)
	}
	if v := val(a.m.keptDropped.WithLabelValues("nic")); v == 0 {
		t.Fatalf("kept_events_dropped_total{check=nic} = 0 after 20 refused runs with room for a few flaps")
	}
	drainSpool(t, a)
	a.RunOnce(context.Background(), sched)
	got := drainSpool(t, a)
	if len(got) == 0 || got[0] != "recovered" {
		t.Errorf("spooled after draining %v, want the kept recovery first", got)
	}
}

// TestKeptFatalNotDropped: the spool is full, even its room for fatal
// events; a check reports fatal and healthy events only, refused and kept.
// Past keptMax the oldest of them were dropped (the original fault, lost
// for good). None is dropped: the check waits, as it did before it could
// run on past refused events, not flagged as wedged, its state not saved;
// once the spool drains every event follows, and then its state is saved.
func TestKeptFatalNotDropped(t *testing.T) {
	cfg := testConfig(t, "127.0.0.1:1")
	cfg.Spool.MaxBytes = 16 << 10
	now := time.Unix(1000, 0)
	var a *Agent
	runs := 0
	c := &committingCheck{spool: func() *Spool { return a.Spool() }}
	c.fakeCheck = fakeCheck{"kmsg", func(context.Context) ([]*datamodels.HealthEvent, error) {
		runs++
		e := &datamodels.HealthEvent{CheckName: "Xid", ComponentClass: "GPU", Message: fmt.Sprintf("run %02d %s", runs, strings.Repeat("z", 400))}
		if runs%2 == 1 {
			e.IsFatal = true
		} else {
			e.IsHealthy = true
		}
		return []*datamodels.HealthEvent{e}, nil
	}}
	sched := Scheduled{Check: c, Interval: time.Minute, Timeout: time.Second}
	a, err := New(cfg, quiet(), Options{Checks: []Scheduled{sched}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Spool().Close()
	a.keptMax = 2 << 10
	fillSpool(t, a)
	for { // the room kept for fatal events, filled
		n, err := a.Spool().Append([]*datamodels.HealthEvent{ev(strings.Repeat("y", 200), true)})
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	for range 20 {
		now = now.Add(time.Minute)
		a.RunOnce(context.Background(), sched)
	}
	if v := val(a.m.keptDropped.WithLabelValues("kmsg")); v != 0 {
		t.Errorf("kept_events_dropped_total{check=kmsg} = %v, want 0: fatal and healthy events are never dropped", v)
	}
	if runs >= 20 {
		t.Errorf("the check ran %d times in 20 runs, want it to wait once its kept fatal and healthy events pass keptMax", runs)
	}
	a.mu.Lock()
	size := 0
	for _, k := range a.unspooled["kmsg"] {
		size += proto.Size(k.ev)
	}
	last := a.lastRun["kmsg"]
	a.mu.Unlock()
	if size > a.keptMax+1024 {
		t.Errorf("kept %d bytes, want no more than keptMax (%d) and one run", size, a.keptMax)
	}
	if !last.Equal(now) {
		t.Errorf("lastRun %v, want %v: a check waiting for the spool is not wedged", last, now)
	}
	if len(c.commits) != 0 {
		t.Errorf("state saved %v while events are kept", c.commits)
	}
	reported := runs
	var got []string
	for range 3 {
		got = append(got, drainSpool(t, a)...)
		a.RunOnce(context.Background(), sched)
	}
	got = append(got, drainSpool(t, a)...)
	seen := map[string]bool{}
	for _, m := range got {
		seen[m] = true
	}
	for i := 1; i <= reported; i++ {
		if m := fmt.Sprintf("run %02d", i); !seen[m] {
			t.Errorf("%s never spooled", m)
		}
	}
	if len(c.commits) == 0 {
		t.Error("state not saved once every kept event was spooled")
	}
}

// TestKeptNotBoundedOnAFailingDisk: a check's refused events are kept;
// then the disk fails while the check reports more than keptMax (kmsg
// catching up a backlog). The events kept before were dropped to bound
// the queue, although the check waits for the disk anyway (the queue
// holds at most one run). Nothing is dropped on a failing disk: once it
// has room again and the spool drains, every event is spooled.
func TestKeptNotBoundedOnAFailingDisk(t *testing.T) {
	cfg := testConfig(t, "127.0.0.1:1")
	cfg.Spool.MaxBytes = 16 << 10
	var a *Agent
	runs := 0
	c := fakeCheck{"kmsg", func(context.Context) ([]*datamodels.HealthEvent, error) {
		runs++
		if runs == 1 {
			return []*datamodels.HealthEvent{{CheckName: "Xid", ComponentClass: "GPU", Message: "kept xid 13"}}, nil
		}
		var evs []*datamodels.HealthEvent
		for i := range 8 {
			evs = append(evs, &datamodels.HealthEvent{CheckName: "Xid", ComponentClass: "GPU", Message: fmt.Sprintf("backlog %d %s", i, strings.Repeat("z", 400))})
		}
		evs[7].IsFatal = true // offered ahead: it meets the failing disk
		return evs, nil
	}}
	sched := Scheduled{Check: c, Interval: time.Minute, Timeout: time.Second}
	a, err := New(cfg, quiet(), Options{Checks: []Scheduled{sched}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Spool().Close()
	a.keptMax = 2 << 10
	fillSpool(t, a)
	a.RunOnce(context.Background(), sched)
	diskFull(t, a.Spool(), 0, func() {
		a.RunOnce(context.Background(), sched)
		a.RunOnce(context.Background(), sched)
	})
	if runs != 2 {
		t.Errorf("the check ran %d times, want 2 (waiting for the failing disk)", runs)
	}
	if v := val(a.m.keptDropped.WithLabelValues("kmsg")); v != 0 {
		t.Errorf("kept_events_dropped_total{check=kmsg} = %v on a failing disk, want 0", v)
	}
	drainSpool(t, a)
	a.RunOnce(context.Background(), sched)
	got := drainSpool(t, a)
	if len(got) < 9 || got[0] != "kept xid 13" {
		t.Errorf("spooled %v, want the event kept before the disk failed, then the backlog", got)
	}
}

// TestRefusalCountedOnceAcrossADiskError: an append whose events the spool
// partly refused (a non-fatal one past 90%) and whose write then failed
// (a full disk) counted its refusals; the caller tries the same events
// again, and they were counted again: the one refused event showed twice
// in faultline_agent_spool_dropped_events_total. A failed append counts
// nothing.
func TestRefusalCountedOnceAcrossADiskError(t *testing.T) {
	cfg := testConfig(t, "127.0.0.1:1")
	cfg.Spool.MaxBytes = 16 << 10
	c := fakeCheck{"c", func(context.Context) ([]*datamodels.HealthEvent, error) { return nil, nil }}
	a, err := New(cfg, quiet(), Options{Checks: []Scheduled{{Check: c, Interval: time.Minute, Timeout: time.Second}}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Spool().Close()
	fillSpool(t, a)
	before := val(a.m.spoolDropped.WithLabelValues("reserved_for_fatal"))
	evs := []*datamodels.HealthEvent{ev("xid 79", true), ev("xid 13", false)}
	diskFull(t, a.Spool(), 0, func() {
		if _, err := a.Spool().Append(evs); err == nil {
			t.Fatal("append on a full disk succeeded")
		}
	})
	if v := val(a.m.spoolDropped.WithLabelValues("reserved_for_fatal")) - before; v != 0 {
		t.Errorf("a failed append counted %v refusals, want none", v)
	}
	if n, err := a.Spool().Append(evs); err != nil || n != 1 {
		t.Fatalf("append: %d %v, want the fatal one taken", n, err)
	}
	if v := val(a.m.spoolDropped.WithLabelValues("reserved_for_fatal")) - before; v != 1 {
		t.Errorf("spool_dropped_events_total{reserved_for_fatal} rose by %v, want 1 (the refused event once)", v)
	}
}
