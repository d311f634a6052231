package clusters

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"time"
	"unique"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/cache"
)

// WatchStopped reports whether a watch error is no failure: the watch
// closed cleanly (it resumes where it was) or was stopped (the role
// closing: context canceled).
func WatchStopped(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, context.Canceled)
}

// WatchErrorLogger reports a failed watch of resource (plural: "nodes") in
// the role's log (client-go's default handler writes to klog, outside it),
// at client-go's levels: a watch closed cleanly or stopped (the role
// closing: context canceled) is not logged, an expired
// resourceVersion (410 Gone: the informer lists again) and a connection cut
// off are routine (Info), anything else is a Warning. The informer retries
// with backoff either way; the roles read live while a watch is not to be
// trusted.
func WatchErrorLogger(log *slog.Logger, resource string) cache.WatchErrorHandler {
	return func(_ *cache.Reflector, err error) {
		switch {
		case WatchStopped(err):
		case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
			log.Info("watch of "+resource+" expired; listing them again", "err", err)
		case errors.Is(err, io.ErrUnexpectedEOF):
			log.Info("watch of "+resource+" cut off; watching again", "err", err)
		default:
			log.Warn("watch of "+resource+" failed; retrying", "err", err)
		}
	}
}

// Interned is m with its keys and values interned (unique.Make): a
// fleet's nodes carry the same few dozen label keys (and mostly the same
// values), which the decoder allocates once per node.
func Interned(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[unique.Make(k).Value()] = unique.Make(v).Value()
	}
	return out
}

// RecentWrite is how long after this replica wrote an object a watch's
// copy of it is used only once it holds that write.
const RecentWrite = 10 * time.Second

// RecentWrites remembers this replica's writes of watched objects (by key,
// e.g. cluster/node) and the resourceVersion each produced: a watch may not
// have delivered a write yet, so for RecentWrite its copy is trusted only
// once it has that resourceVersion. The zero value is ready to use.
type RecentWrites struct {
	mu     sync.Mutex
	writes map[string]recentWrite
	pruned time.Time
}

type recentWrite struct {
	at time.Time
	rv string
}

// Wrote notes a write of key at now: rv is the resourceVersion it
// produced, "" while it is in flight or when it failed (the copy is not
// trusted for RecentWrite).
func (r *RecentWrites) Wrote(key string, now time.Time, rv string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.writes == nil {
		r.writes = map[string]recentWrite{}
	}
	r.writes[key] = recentWrite{at: now, rv: rv}
	if now.Sub(r.pruned) > RecentWrite {
		for k, w := range r.writes {
			if now.Sub(w.at) >= RecentWrite {
				delete(r.writes, k)
			}
		}
		r.pruned = now
	}
}

// Trusted reports whether a watch's copy of key at resourceVersion rv may
// be used at now: this replica made no write of it within RecentWrite, or
// the copy holds the last one.
func (r *RecentWrites) Trusted(key, rv string, now time.Time) bool {
	r.mu.Lock()
	w, ok := r.writes[key]
	r.mu.Unlock()
	return !ok || now.Sub(w.at) >= RecentWrite || (w.rv != "" && w.rv == rv)
}
