package pipeline

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/schemas/events"
)

// TestByKey: each key's items in their order, results in the order the
// keys first appear, at most workers keys at once.
func TestByKey(t *testing.T) {
	items := []string{"a1", "b1", "a2", "c1", "b2", "a3", "d1", "e1"}
	var running, most atomic.Int32
	var mu sync.Mutex
	met := make(chan struct{})
	meet := sync.OnceFunc(func() { close(met) })
	results := ByKey(items, func(s string) string { return s[:1] }, 2, func(group []string) string {
		n := running.Add(1)
		mu.Lock()
		if n > most.Load() {
			most.Store(n)
		}
		mu.Unlock()
		if n == 2 {
			meet()
		}
		// Until two keys have run at once, wait for the other worker
		// (a starved machine may start it late); a bound, not a sleep,
		// so one worker alone still shows as most == 1.
		select {
		case <-met:
		case <-time.After(2 * time.Second):
		}
		time.Sleep(20 * time.Millisecond)
		running.Add(-1)
		return strings.Join(group, "+")
	})
	if want := []string{"a1+a2+a3", "b1+b2", "c1", "d1", "e1"}; !slices.Equal(results, want) {
		t.Fatalf("results %v, want %v", results, want)
	}
	if m := most.Load(); m != 2 {
		t.Fatalf("%d keys at once, want at most (and, here, exactly) 2", m)
	}
	if got := ByKey([]int{}, func(int) string { return "" }, 0, func([]int) int { return 1 }); len(got) != 0 {
		t.Fatalf("no items: %v", got)
	}
}

// TestDeadLetterFitsTheProducer: a record near the broker's own limit (1
// MiB by default), or with a huge reason, is dead-lettered within what the
// producer sends — without its value, which its size and SHA-256 name —
// where its dead letter failed, and so its batch at every try; an
// ordinary record's dead letter carries it whole.
func TestDeadLetterFitsTheProducer(t *testing.T) {
	h := newHarness(t, 1, events.TopicDeadLetter)
	big := &kgo.Record{Topic: "faultline.events", Key: []byte("c1/n1"), Value: bytes.Repeat([]byte("x"), 1_000_000), Offset: 7}
	small := &kgo.Record{Topic: "faultline.events", Key: []byte("c1/n1"), Value: []byte("v"), Offset: 8}
	sum := sha256.Sum256(big.Value)
	for _, tc := range []struct {
		rec           *kgo.Record
		reason        string
		value, sha256 string
	}{
		{big, "poison record: event x: generatedTimestamp is not a valid timestamp", "", hex.EncodeToString(sum[:])},
		{small, strings.Repeat("r", 2_000_000), "v", ""},
	} {
		dl := DeadLetter(tc.rec, errors.New(tc.reason))
		if string(dl.Value) != tc.value || header(dl, events.HeaderValueSHA256) != tc.sha256 || len(header(dl, events.HeaderError)) > 4096 ||
			header(dl, events.HeaderSourceOff) != strconv.FormatInt(tc.rec.Offset, 10) {
			t.Fatalf("dead letter of %d bytes: value %d bytes, sha256 %q, reason %d bytes, offset %q", len(tc.rec.Value), len(dl.Value),
				header(dl, events.HeaderValueSHA256), len(header(dl, events.HeaderError)), header(dl, events.HeaderSourceOff))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := h.cl.ProduceSync(ctx, dl).FirstErr()
		cancel()
		if err != nil {
			t.Fatalf("producing the dead letter of a %d-byte record: %v", len(tc.rec.Value), err)
		}
	}
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
