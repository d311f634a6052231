package agent

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

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
