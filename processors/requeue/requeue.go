// Package requeue lets a stateless processor role come back to a piece of
// long-running work (a drain that waits for pods, a reboot that waits for
// its resource's condition) without holding a Kafka batch open: the role
// produces a record to its own requeue topic with a not-before time, and
// consumes that topic as well. The record is produced with the batch's
// outputs before the batch's offsets are committed, so a processor that
// dies mid-work leaves either the original record or the requeue record
// uncommitted, and whichever replica picks it up resumes from the state
// kept in Kubernetes.
package requeue

import (
	"context"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Header names of requeue records.
const (
	// HeaderNotBefore is the earliest time (Unix milliseconds) the record
	// may be handled.
	HeaderNotBefore = "faultline-not-before"
	// HeaderAttempt counts how often the work was requeued.
	HeaderAttempt = "faultline-requeue-attempt"
)

// Record returns a record for topic that carries rec's key and value (the
// work's original trigger) and may be handled from notBefore on.
func Record(topic string, rec *kgo.Record, notBefore time.Time) *kgo.Record {
	return &kgo.Record{
		Topic: topic,
		Key:   rec.Key,
		Value: rec.Value,
		Headers: []kgo.RecordHeader{
			{Key: HeaderNotBefore, Value: []byte(strconv.FormatInt(notBefore.UnixMilli(), 10))},
			{Key: HeaderAttempt, Value: []byte(strconv.Itoa(Attempt(rec) + 1))},
		},
	}
}

// NotBefore returns the record's not-before time; zero for a record that
// was not requeued.
func NotBefore(rec *kgo.Record) time.Time {
	for _, h := range rec.Headers {
		if h.Key == HeaderNotBefore {
			ms, err := strconv.ParseInt(string(h.Value), 10, 64)
			if err != nil {
				return time.Time{}
			}
			return time.UnixMilli(ms)
		}
	}
	return time.Time{}
}

// Attempt returns how often the record's work was requeued (0 for an
// original record).
func Attempt(rec *kgo.Record) int {
	for _, h := range rec.Headers {
		if h.Key == HeaderAttempt {
			n, _ := strconv.Atoi(string(h.Value))
			return n
		}
	}
	return 0
}

// Wait blocks until the record's not-before time as seen by now, at most
// max (so a batch timeout is never exceeded), or until ctx ends. It
// reports false when ctx ended.
func Wait(ctx context.Context, rec *kgo.Record, now func() time.Time, max time.Duration) bool {
	nb := NotBefore(rec)
	if nb.IsZero() {
		return ctx.Err() == nil
	}
	d := min(nb.Sub(now()), max)
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
