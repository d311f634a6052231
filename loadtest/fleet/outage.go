package fleet

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/faultline/faultline/processors/pipeline"
	"github.com/faultline/faultline/processors/quarantine"
)

// runClusterOutage: the first cluster's apiserver is down for the whole
// run and the second's blinks; Faults fatal events are sent to each while
// they are down (the breaker's share at most, so none is held). Both are
// deferred to their retry topics; the third cluster, up throughout, its
// faults sent beside theirs, is cordoned at once meanwhile. The blinking
// cluster answers again and its faults must be cordoned while the first
// stays down — with one retry topic for every cluster and a failed batch
// retried before the next poll, they waited for the first to come back.
// Then the first answers and its faults are cordoned: every fault once,
// none lost.
// deferredTo is how many records were ever deferred to cluster's
// quarantine retry topic; -1 when they cannot be listed.
func deferredTo(ctx context.Context, adm *kadm.Client, cluster string) int64 {
	return topicRecords(ctx, adm, quarantine.RetryTopic(cluster))
}

// topicRecords is how many records were ever produced to topic (its end
// offsets); -1 when they cannot be listed.
func topicRecords(ctx context.Context, adm *kadm.Client, topic string) int64 {
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return -1
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	return n
}

// quarantineLag is the quarantine group's lag on its own topics; false
// when it cannot be read.
func quarantineLag(ctx context.Context, adm *kadm.Client) (int64, bool) {
	return groupLag(ctx, adm, quarantine.Role, "")
}

// groupLag is the lag of role's consumer group (pipeline.DefaultGroup) on
// topic, or on all its topics where topic is ""; false when it cannot be
// read.
func groupLag(ctx context.Context, adm *kadm.Client, role, topic string) (int64, bool) {
	group := pipeline.DefaultGroup(role)
	lags, err := adm.Lag(ctx, group)
	l, ok := lags[group]
	if err != nil || !ok || l.Error() != nil {
		return 0, false
	}
	if topic != "" {
		return l.Lag.TotalByTopic()[topic].Lag, true
	}
	return l.Lag.Total(), true
}

func runClusterOutage(ctx context.Context, e *Env, p Params, r *Report) error {
	if len(e.Clusters) < 3 || len(e.Kubes) < len(e.Clusters) {
		return fmt.Errorf("cluster-outage: needs 3 clusters, each with a kube-apiserver (%d clusters, %d apiservers)", len(e.Clusters), len(e.Kubes))
	}
	down, blink, up := e.Clusters[0], e.Clusters[1], e.Clusters[2]
	faults := min(p.Faults, breakerShare(p.Nodes))
	var pushbacks atomic.Int64
	send := func(cluster string) error {
		for i := range faults {
			if err := e.sendFault(ctx, cluster, i, &pushbacks); err != nil {
				return err
			}
		}
		return nil
	}
	adm := kadm.NewClient(e.KafkaClient())
	deferred := func(cluster string) int64 { return deferredTo(ctx, adm, cluster) }
	cordoned := func(cluster string) func() bool {
		return func() bool { return e.Cordons.CountIn(cluster) >= faults }
	}
	// After an apiserver is back, the cordons are seen by listing: the
	// tool's own watch of it reconnects with client-go's backoff (up to
	// seconds after an outage), which the pipeline does not wait for.
	listed := func(cluster string) func() bool {
		return func() bool {
			l, err := e.Kubes[cluster].Client().CoreV1().Nodes().List(ctx, metav1.ListOptions{FieldSelector: "spec.unschedulable=true"})
			return err == nil && len(l.Items) >= faults
		}
	}

	// The up cluster's faults are sent beside the others', as their
	// apiservers have just died: the batches that meet a dead cluster
	// first must not hold them up. The warm-up is handled before the
	// kills (the quarantine group caught up), so those batches are the
	// faults'.
	caughtUp := waitFor(ctx, 60*time.Second, func() bool {
		lag, ok := quarantineLag(ctx, adm)
		return ok && lag == 0
	})
	r.Check(caughtUp, "the quarantine group caught up with the warm-up before the kills")
	e.Kubes[down].Kill()
	e.Kubes[blink].Kill()
	var sends errgroup.Group
	sentUp := time.Now()
	for _, c := range []string{down, blink, up} {
		sends.Go(func() error { return send(c) })
	}
	if err := sends.Wait(); err != nil {
		return err
	}
	okUp := waitFor(ctx, 60*time.Second, cordoned(up))
	upTook := time.Since(sentUp)
	okDeferred := waitFor(ctx, 60*time.Second, func() bool { return deferred(down) >= int64(faults) && deferred(blink) >= int64(faults) })
	r.Check(okDeferred, "deferred %d of %s's and %d of %s's %d faults to their retry topics", deferred(down), down, deferred(blink), blink, faults)

	e.Kubes[blink].Start()
	back := time.Now()
	okBlink := waitFor(ctx, 120*time.Second, listed(blink))
	blinkTook := time.Since(back)
	downWhile := e.Cordons.CountIn(down)

	e.Kubes[down].Start()
	backDown := time.Now()
	okDown := waitFor(ctx, 120*time.Second, listed(down))
	downTook := time.Since(backDown)
	// Once the watch is back, a fault cordoned twice would show within 2 s.
	waitFor(ctx, time.Minute, func() bool { return cordoned(blink)() && cordoned(down)() })
	time.Sleep(2 * time.Second)
	_, twice := e.Cordons.Count()

	r.Figure("cluster-outage over %s: %d faults per cluster; %s down throughout, %s down while its faults were sent: %d and %d deferred to their retry topics; %s (up, its faults sent beside theirs) cordoned in %s from the first send; %s cordoned %s after its apiserver was ready again (listed; %s still down: %d cordoned); %s cordoned %s after it was; %d cordoned twice, %d sends pushed back",
		e.Describe(), faults, down, blink, deferred(down), deferred(blink), up, upTook.Round(time.Millisecond),
		blink, blinkTook.Round(time.Millisecond), down, downWhile, down, downTook.Round(time.Millisecond), twice, pushbacks.Load())
	r.Check(okUp, "%s: %d of %d faults cordoned while the others were down", up, e.Cordons.CountIn(up), faults)
	r.Check(okBlink, "%s: %d of %d faults cordoned within 120s of its apiserver being back, %s still down", blink, e.Cordons.CountIn(blink), faults, down)
	r.Check(downWhile == 0, "%s: %d nodes cordoned while its apiserver was down", down, downWhile)
	r.Check(okDown, "%s: %d of %d faults cordoned within 120s of its apiserver being back", down, e.Cordons.CountIn(down), faults)
	r.Check(twice == 0, "%d nodes cordoned twice", twice)
	return nil
}
