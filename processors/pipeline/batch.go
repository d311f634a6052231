package pipeline

import (
	"cmp"
	"fmt"
	"runtime/debug"
	"sync"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
	faultlinev1 "github.com/faultline/faultline/schemas/gen/faultline/v1"
)

// ByKey is the worker pool of the roles that act per node: it groups items
// by key (the record key, cluster/node), calls do once per key with that
// key's items in their order, different keys concurrently, at most workers
// at a time (workers < 1 means one), and returns do's results in the order
// the keys first appear in items. One node's records are so handled in
// offset order while a batch's nodes proceed side by side. A panic in do
// is raised again in the caller once every key is done, where the
// runner's recover fails the batch (it is held and retried): from a
// worker goroutine it would end the process, every replica in turn.
func ByKey[T, R any](items []T, key func(T) string, workers int, do func(items []T) R) []R {
	var keys []string
	groups := map[string][]T{}
	for _, it := range items {
		k := key(it)
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], it)
	}
	results := make([]R, len(keys))
	sem := make(chan struct{}, max(workers, 1))
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		panicked error
	)
	for i, k := range keys {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			defer func() {
				if p := recover(); p != nil {
					mu.Lock()
					panicked = cmp.Or(panicked, Panic(p))
					mu.Unlock()
				}
			}()
			results[i] = do(groups[k])
		}()
	}
	wg.Wait()
	if panicked != nil {
		panic(raised{panicked})
	}
	return results
}

// Panic is the error of a recovered panic p, with the stack that raised
// it; called from the deferred function that recovered it.
func Panic(p any) error {
	if r, ok := p.(raised); ok {
		return r.error // ByKey's: its stack is the worker's
	}
	return fmt.Errorf("panic: %v\n%s", p, debug.Stack())
}

// Safe returns f with a panic made its error, for the goroutines a
// handler starts itself (errgroup's), where it would end the process.
func Safe(f func() error) func() error {
	return func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = Panic(p)
			}
		}()
		return f()
	}
}

// raised is a worker's panic raised again by ByKey.
type raised struct{ error }

// ActionRec is one decoded record of the actions topic (or of a requeue
// topic carrying its records).
type ActionRec struct {
	Rec    *kgo.Record
	Action *faultlinev1.Action
	// Cluster and Node are the record's (key and payload agree).
	Cluster, Node string
}

// Key is the record key, cluster/node.
func (a ActionRec) Key() string { return string(a.Rec.Key) }

// DecodeActions decodes a batch of action records and keeps those keep
// accepts (nil keeps all). A record whose key and payload disagree
// (ActionKey) or that does not decode is dead; actions keep refuses are
// left out, not dead: they are other roles' business.
func DecodeActions(recs []*kgo.Record, keep func(*faultlinev1.Action) bool) ([]ActionRec, []Dead) {
	var (
		out  []ActionRec
		dead []Dead
	)
	for _, r := range recs {
		cluster, node, err := ActionKey(r)
		if err != nil {
			dead = append(dead, Dead{Record: r, Reason: err})
			continue
		}
		a, err := events.UnmarshalAction(r.Value)
		if err != nil {
			dead = append(dead, Dead{Record: r, Reason: err})
			continue
		}
		if keep != nil && !keep(a) {
			continue
		}
		out = append(out, ActionRec{Rec: r, Action: a, Cluster: cluster, Node: node})
	}
	return out, dead
}

// EventRec is one decoded record of the events topic (or of a topic
// carrying its records, such as quarantine's retry topic).
type EventRec struct {
	Rec   *kgo.Record
	Event *datamodels.HealthEvent
	// Cluster and Node are the record's (key and payload agree); the
	// event's Cluster and NodeName are set to them.
	Cluster, Node string
}

// DecodeEvents decodes a batch of event records. A record whose key and
// payload disagree (EventKey) or that does not decode is dead.
func DecodeEvents(recs []*kgo.Record) ([]EventRec, []Dead) {
	var (
		out  []EventRec
		dead []Dead
	)
	for _, r := range recs {
		cluster, node, err := EventKey(r)
		if err != nil {
			dead = append(dead, Dead{Record: r, Reason: err})
			continue
		}
		ev, err := events.Unmarshal(r.Value)
		if err != nil {
			dead = append(dead, Dead{Record: r, Reason: err})
			continue
		}
		ev.Cluster, ev.NodeName = cluster, node
		out = append(out, EventRec{Rec: r, Event: ev, Cluster: cluster, Node: node})
	}
	return out, dead
}
