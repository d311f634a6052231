package clusters

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"unique"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/cache"
)

// WatchStopped reports whether a watch error is no failure: the watch was
// stopped (the role closing: context canceled). Anything else is a failure,
// io.EOF included: client-go hands the watch error handler only failed
// lists and failed watch starts (a watch that closes normally resumes
// without it, and an EOF at a watch's start is an empty watch), so an EOF
// there is a request a load balancer accepted and closed, no apiserver
// behind it (`Get "https://…/api/v1/nodes": EOF`).
func WatchStopped(err error) bool {
	return errors.Is(err, context.Canceled)
}

// WatchErrorLogger reports a failed watch of resource (plural: "nodes") in
// the role's log (client-go's default handler writes to klog, outside it):
// a watch stopped (the role closing: context canceled) is not logged, an
// expired resourceVersion (410 Gone: the informer lists again) and a
// connection cut off are routine (Info), anything else (a list closed
// with EOF included) is a Warning. The informer retries with backoff
// either way; the roles read live while a watch is not to be trusted.
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
