package janitor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"time"

	"github.com/faultline/faultline/internal/warnlimit"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// LeaseName is the Lease (coordination.k8s.io) in each cluster's
// janitor.lease_namespace with which the janitors serving the cluster
// elect the one that works it (janitor.leader_election).
const LeaseName = "faultline-janitor"

// leaseIdentity is this process's name on the Lease: the janitor's
// identity and a random suffix, so that two processes of one host (or a
// restarted one) never both hold it.
func leaseIdentity(identity string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return identity + "_" + hex.EncodeToString(b)
}

// lead works the cluster (runCluster) while this process holds its Lease,
// or at once without leader election; a cluster without a kubeconfig (a
// dry-run cluster) it runs at once too, exported as worked by none.
// It returns when runCluster does: on ctx's end, when the Lease is lost
// (not renewed within two thirds of lease_duration: another janitor may
// take it once lease_duration has passed), or on runCluster's own error.
// The Lease is released only after runCluster has returned, so that its
// next holder starts once this one's steps have stopped.
func (j *Janitor) lead(ctx context.Context, name string) error {
	cl, err := j.reg.Get(name)
	if err != nil {
		return err
	}
	if cl.Kube == nil {
		// Nothing to watch (a dry-run cluster without a kubeconfig): no
		// janitor works it, whichever holds nothing.
		j.m.watchable.WithLabelValues(name).Set(0)
		j.m.leader.WithLabelValues(name).Set(0)
		return j.runCluster(ctx, name)
	}
	j.m.watchable.WithLabelValues(name).Set(1)
	if !j.cfg.LeaderElection {
		j.m.leader.WithLabelValues(name).Set(1)
		return j.runCluster(ctx, name)
	}
	j.m.leader.WithLabelValues(name).Set(0) // exported while another janitor works it
	leading := make(chan context.Context, 1)
	d := j.cfg.LeaseDuration
	lock := &warnedLock{Interface: &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: j.cfg.LeaseNamespace, Name: LeaseName},
		Client:     cl.Kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: j.leaseID},
	}, spaced: warnlimit.New(time.Minute, 1), warn: func(err error) {
		j.log.Warn("janitor: the cluster's Lease cannot be read or written; the cluster is not worked by this janitor until it can (janitor.lease_namespace and its RBAC: deploy/rbac/janitor.yaml)",
			"cluster", name, "lease", j.cfg.LeaseNamespace+"/"+LeaseName, "err", err)
	}}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:          lock,
		LeaseDuration: d,
		RenewDeadline: d * 2 / 3,
		RetryPeriod:   d * 2 / 15,
		// Not ReleaseOnCancel: client-go releases before it ends the
		// leader's context, which would leave this janitor working the
		// cluster up to renew_deadline more after a lost renewal. lead
		// releases the Lease itself once runCluster has returned.
		Name: name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(c context.Context) { leading <- c },
			OnStoppedLeading: func() {},
			OnNewLeader: func(id string) {
				if id != j.leaseID {
					j.log.Info("janitor: another janitor works the cluster", "cluster", name, "leader", id)
				}
			},
		},
	})
	if err != nil {
		return err
	}
	// The elector outlives ctx until runCluster has returned.
	ectx, stopElector := context.WithCancel(context.WithoutCancel(ctx))
	defer stopElector()
	elected := make(chan struct{})
	go func() {
		defer close(elected)
		le.Run(ectx)
	}()
	select {
	case <-ctx.Done():
		stopElector()
		<-elected
		return nil
	case <-elected:
		return errors.New("the cluster's Lease was lost as soon as it was taken")
	case held := <-leading:
		rctx, stop := context.WithCancel(held) // ends when a renewal fails
		defer stop()
		context.AfterFunc(ctx, stop)
		j.m.leader.WithLabelValues(name).Set(1)
		j.log.Info("janitor: working the cluster (its Lease is held)", "cluster", name, "identity", j.leaseID)
		err := j.runCluster(rctx, name)
		j.m.leader.WithLabelValues(name).Set(0)
		lost := held.Err() != nil && ctx.Err() == nil
		stopElector()
		<-elected
		if lost {
			return errors.Join(err, errors.New("the cluster's Lease was not renewed in time"))
		}
		j.release(lock)
		return err
	}
}

// release gives up the Lease this janitor holds (what client-go's
// ReleaseOnCancel writes), so that another janitor takes it at its next
// try instead of after lease_duration.
func (j *Janitor) release(lock resourcelock.Interface) {
	ctx, cancel := context.WithTimeout(context.Background(), j.cfg.LeaseDuration*2/3)
	defer cancel()
	rec, _, err := lock.Get(ctx)
	if err != nil || rec.HolderIdentity != j.leaseID {
		return
	}
	now := metav1.Now()
	_ = lock.Update(ctx, resourcelock.LeaderElectionRecord{LeaderTransitions: rec.LeaderTransitions, LeaseDurationSeconds: 1, RenewTime: now, AcquireTime: now})
}

// warnedLock is a Lease lock that warns of the errors that keep this
// janitor from the Lease (forbidden, no such namespace, the API server
// down), at most once a minute, with the cluster: client-go's elector logs
// them itself through klog (component client-go in faultline's log, at
// library_log_level), without the cluster. A missing Lease (created next)
// and a lost race for it (another janitor's write first) are its normal
// course.
type warnedLock struct {
	resourcelock.Interface
	warn   func(error)
	spaced *warnlimit.Limit // one key: once a minute
}

func (l *warnedLock) check(err error) error {
	if err == nil || apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err) {
		return err
	}
	if named, _ := l.spaced.Allow("", time.Now()); named {
		l.warn(err)
	}
	return err
}

func (l *warnedLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	r, b, err := l.Interface.Get(ctx)
	if apierrors.IsNotFound(err) {
		return r, b, err // created next (a missing namespace fails the create, and is warned of there)
	}
	return r, b, l.check(err)
}

func (l *warnedLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return l.check(l.Interface.Create(ctx, ler))
}

func (l *warnedLock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return l.check(l.Interface.Update(ctx, ler))
}
