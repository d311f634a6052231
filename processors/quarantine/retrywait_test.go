package quarantine

import (
	"regexp"
	"strings"
	"testing"

	"github.com/faultline/faultline/processors/pipeline"
)

// TestRetryWaitingConsumed: records are waiting from when they are read
// until the group's committed offset of their partition passes them.
func TestRetryWaitingConsumed(t *testing.T) {
	w := newRetryWaiting(nil, retryGroup, []string{RetryTopic("c")})
	p0, p1 := pipeline.TopicPart{Topic: RetryTopic("c"), Partition: 0}, pipeline.TopicPart{Topic: RetryTopic("c"), Partition: 1}
	read := func(tp pipeline.TopicPart, off int64, key string) {
		w.keys[key]++
		w.queued[tp] = append(w.queued[tp], waitingRecord{offset: off, key: key})
	}
	read(p0, 10, "c/a")
	read(p0, 11, "c/b")
	read(p0, 12, "c/a")
	read(p1, 3, "c/a")
	for _, step := range []struct {
		committed map[pipeline.TopicPart]int64
		waits     map[string]bool
	}{
		{nil, map[string]bool{"c/a": true, "c/b": true, "c/c": false}},
		{map[pipeline.TopicPart]int64{p0: 10}, map[string]bool{"c/a": true, "c/b": true}},          // nothing before 10
		{map[pipeline.TopicPart]int64{p0: 12}, map[string]bool{"c/a": true, "c/b": false}},         // a's second and p1's wait
		{map[pipeline.TopicPart]int64{p0: 13}, map[string]bool{"c/a": true}},                       // p1 not committed
		{map[pipeline.TopicPart]int64{p0: 13, p1: 4}, map[string]bool{"c/a": false, "c/b": false}}, // all consumed
	} {
		w.consumed(step.committed)
		for key, want := range step.waits {
			if got := w.waits([]byte(key)); got != want {
				t.Errorf("committed %v: waits(%s) = %v, want %v", step.committed, key, got, want)
			}
		}
	}
	if len(w.keys) != 0 {
		t.Errorf("keys left: %v", w.keys)
	}
}

// TestRetryTopic: each cluster's deferred records have a topic of their
// own, named by the cluster when it is a DNS label, else by a hash (Kafka
// topic names: [a-zA-Z0-9._-], at most 249 bytes, '.' and '_' colliding
// in its metric names).
func TestRetryTopic(t *testing.T) {
	for _, tc := range []struct {
		cluster, want string
	}{
		{"prod", "faultline.quarantine.retry.prod"},
		{"us-east-1", "faultline.quarantine.retry.us-east-1"},
		{"us_east.1", "faultline.quarantine.retry.h"},
		{"Prod", "faultline.quarantine.retry.h"},
		{"gpu/west", "faultline.quarantine.retry.h"},
		{strings.Repeat("a", 64), "faultline.quarantine.retry.h"}, // over a DNS label's 63
	} {
		got := RetryTopic(tc.cluster)
		if !strings.HasPrefix(got, tc.want) || len(got) > 249 || !regexp.MustCompile(`^[a-z0-9.-]+$`).MatchString(got) {
			t.Errorf("RetryTopic(%q) = %q, want %q…", tc.cluster, got, tc.want)
		}
		if strings.HasSuffix(tc.want, ".h") && len(got) != len(tc.want)+16 {
			t.Errorf("RetryTopic(%q) = %q: not a 16-hex hash", tc.cluster, got)
		}
	}
	if RetryTopic("us_east.1") == RetryTopic("us.east_1") {
		t.Error("two clusters share a retry topic")
	}
}
