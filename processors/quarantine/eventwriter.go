package quarantine

import (
	"context"
	"log/slog"
	"sync"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/faultline/faultline/processors/clusters"
)

// eventQueue is how many node Events may wait per cluster; more are
// dropped and counted, as client-go's event recorder does.
const eventQueue = 1024

// eventWriter creates node Events in the background, per cluster at most
// node_event_qps a second: Events are informational, best effort, and must
// never take the client QPS that a cordon of a fatal event is waiting for.
type eventWriter struct {
	qps     float64
	log     *slog.Logger
	failed  func(cluster string)
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	queues  map[string]chan *corev1.Event
	stopped bool
}

func newEventWriter(qps float64, log *slog.Logger, failed func(cluster string)) *eventWriter {
	ctx, cancel := context.WithCancel(context.Background())
	return &eventWriter{qps: qps, log: log, failed: failed, ctx: ctx, cancel: cancel, queues: map[string]chan *corev1.Event{}}
}

// enqueue queues ev for cl; false: the queue is full (or the writer
// stopped) and ev is dropped.
func (w *eventWriter) enqueue(cl *clusters.Client, ev *corev1.Event) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return false
	}
	q, ok := w.queues[cl.Name]
	if !ok {
		q = make(chan *corev1.Event, eventQueue)
		w.queues[cl.Name] = q
		w.wg.Add(1)
		go w.run(cl, q)
	}
	select {
	case q <- ev:
		return true
	default:
		return false
	}
}

func (w *eventWriter) run(cl *clusters.Client, q chan *corev1.Event) {
	defer w.wg.Done()
	lim := rate.NewLimiter(rate.Limit(w.qps), 10)
	for {
		select {
		case <-w.ctx.Done():
			return
		case ev := <-q:
			if lim.Wait(w.ctx) != nil {
				return
			}
			_, err := cl.Kube.CoreV1().Events(ev.Namespace).Create(w.ctx, ev, metav1.CreateOptions{})
			if err != nil && !apierrors.IsAlreadyExists(err) && w.ctx.Err() == nil {
				w.failed(cl.Name)
				w.log.Debug("node Event not created", "cluster", cl.Name, "node", ev.InvolvedObject.Name, "err", err)
			}
		}
	}
}

// stop ends the writers; queued Events are dropped.
func (w *eventWriter) stop() {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
	w.cancel()
	w.wg.Wait()
}
