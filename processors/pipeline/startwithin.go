package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// atStart is the start offset franz-go gives a partition without a commit
// (the default ConsumeStartOffset).
var atStart = kgo.NewOffset().AtStart().EpochOffset()

// startWithin returns the group's AdjustFetchOffsetsFn for
// Config.StartWithin: a partition the group has no commit for (franz-go
// gives it the start offset, AtStart) starts at startOffsets' answer,
// committed at once (commitStarts); a committed one is left alone. Where
// the listing fails — or the group joined before its client was kept —
// the partition keeps the log's start: slower, nothing skipped.
func startWithin(within time.Duration, kept *atomic.Pointer[kgo.Client], log *slog.Logger) func(context.Context, map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
	return func(ctx context.Context, offsets map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
		parts := map[string][]int32{}
		for topic, ps := range offsets {
			for p, o := range ps {
				if o.EpochOffset() == atStart { // no commit
					parts[topic] = append(parts[topic], p)
				}
			}
		}
		cl := kept.Load()
		if len(parts) == 0 || cl == nil {
			return offsets, nil
		}
		from := time.Now().Add(-within)
		starts, err := startOffsets(ctx, kadm.NewClient(cl), from, parts, nil)
		if err != nil {
			log.Warn("uncommitted partitions start at the log's start: their offsets by time could not be listed", "from", from.UTC().Format(time.RFC3339), "err", err)
			return offsets, nil
		}
		for topic, ps := range starts {
			for p, at := range ps {
				offsets[topic][p] = kgo.NewOffset().At(at)
			}
		}
		go commitStarts(cl, starts, log)
		return offsets, nil
	}
}

// StartOffsets returns where a group with Config.StartWithin starts each
// partition of parts it has no commit for, from = now − StartWithin (see
// startOffsets): for a follower of a group's topics that must read what
// the group will (the quarantine role's retry-topic follower). Listed
// before the group's own start, its from is no later than the group's.
func StartOffsets(ctx context.Context, adm *kadm.Client, from time.Time, parts map[string][]int32) (map[string]map[int32]int64, error) {
	return startOffsets(ctx, adm, from, parts, nil)
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

// commitStarts commits the starts startWithin chose where the group has
// committed nothing later since (a record handled meanwhile wins). A
// group commits where it started a partition at once, not only once it
// handled a record there: otherwise a group that restarts before that —
// an idle partition, a batch its handler holds (the quarantine role's
// retry consumer while a cluster is down) — starts the partition
// StartWithin back from its new start, and what was written between the
// two, older than StartWithin by then, is never read. franz-go takes an
// adjusted start for the group's committed offset (it is not marked: a
// mark at it commits nothing), so the start is committed on its own, from
// a goroutine: startWithin runs inside the client's group management.
func commitStarts(cl *kgo.Client, starts map[string]map[int32]int64, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	have := cl.CommittedOffsets()
	offs := map[string]map[int32]kgo.EpochOffset{}
	for topic, ps := range starts {
		for p, at := range ps {
			if o, ok := have[topic][p]; ok && o.Offset > at {
				continue
			}
			if offs[topic] == nil {
				offs[topic] = map[int32]kgo.EpochOffset{}
			}
			offs[topic][p] = kgo.EpochOffset{Epoch: -1, Offset: at}
		}
	}
	if len(offs) == 0 {
		return
	}
	cl.CommitOffsetsSync(ctx, offs, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err == nil {
			err = commitError(resp)
		}
		if err != nil && !errors.Is(err, kgo.ErrClientClosed) && !errors.Is(err, context.Canceled) {
			log.Warn("the group's start on uncommitted partitions not committed: a restart before a record is handled there starts them again by time", "err", err)
		}
	})
}
