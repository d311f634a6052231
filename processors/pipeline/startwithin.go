package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// atStart is the start offset franz-go gives a partition without a commit
// (the default ConsumeStartOffset).
var atStart = kgo.NewOffset().AtStart().EpochOffset()

// startWithin returns the group's AdjustFetchOffsetsFn for
// Config.StartWithin: a partition the group has no commit for (franz-go
// gives it the start offset, AtStart) starts at startOffsets' answer; a
// committed one is left alone. Where the listing fails the partition keeps
// the log's start: slower, nothing skipped.
func startWithin(within time.Duration, adm *atomic.Pointer[kadm.Client], log *slog.Logger) func(context.Context, map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	return func(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
		parts := map[string][]int32{}
		for topic, ps := range offsets {
			for p, o := range ps {
				if o.EpochOffset() == atStart { // no commit
					parts[topic] = append(parts[topic], p)
				}
			}
		}
		a := adm.Load()
		if len(parts) == 0 || a == nil { // nil: before the client was kept; the log's start
			return offsets, nil
		}
		from := time.Now().Add(-within)
		starts, err := startOffsets(ctx, a, from, parts, nil)
		if err != nil {
			log.Warn("uncommitted partitions start at the log's start: their offsets by time could not be listed", "from", from.UTC().Format(time.RFC3339), "err", err)
			return offsets, nil
		}
		for topic, ps := range starts {
			for p, at := range ps {
				offsets[topic][p] = kgo.NewOffset().At(at)
			}
		}
		return offsets, nil
	}
}

// startOffsets returns, for each partition of parts, the offset of its
// first record stamped at or after from — or, where there is none, its
// end as listed before that search. The order is what makes it safe: a
// by-time search that finds nothing answers -1, and franz-go's AfterMilli
// (and kadm's) then take the end from a second listing; a record produced
// between the two listings — a role's first start while its topic fills —
// is after that end and never read. The end listed first is at or before
// any record a later search could miss. between (tests) runs between the
// two listings.
func startOffsets(ctx context.Context, adm *kadm.Client, from time.Time, parts map[string][]int32, between func()) (map[string]map[int32]int64, error) {
	var topics []string
	for t := range parts {
		topics = append(topics, t)
	}
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("list end offsets: %w", err)
	}
	if between != nil {
		between()
	}
	after, err := adm.ListOffsetsAfterMilli(ctx, from.UnixMilli(), topics...)
	if err == nil {
		err = after.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("list offsets after %s: %w", from.UTC().Format(time.RFC3339), err)
	}
	out := map[string]map[int32]int64{}
	for topic, ps := range parts {
		out[topic] = map[int32]int64{}
		for _, p := range ps {
			end, ok1 := ends.Lookup(topic, p)
			at, ok2 := after.Lookup(topic, p)
			if !ok1 || !ok2 {
				return nil, fmt.Errorf("partition %s/%d not listed", topic, p)
			}
			out[topic][p] = end.Offset
			if at.Offset >= 0 && at.Offset < end.Offset {
				out[topic][p] = at.Offset
			}
		}
	}
	return out, nil
}
