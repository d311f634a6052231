package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/faultline/faultline/internal/fleetsim"
	"github.com/faultline/faultline/internal/kafka"
	"github.com/faultline/faultline/schemas/events"
)

// summarize prints every decision the pipeline records (the actions topic)
// as it happens, and a running total every 10 seconds. Strings from the
// records are printed quoted (%q), so no control character in them reaches
// the terminal.
func summarize(ctx context.Context, kcfg kafka.Config, log *slog.Logger, out io.Writer, sim *fleetsim.Stats) error {
	cl, err := kafka.NewClient(kcfg, log, kgo.ConsumeTopics(events.TopicActions, events.TopicEvents),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()))
	if err != nil {
		return err
	}
	defer cl.Close()
	totals := map[string]int{}
	var derived, eventsSeen int
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fs := cl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		fs.EachRecord(func(r *kgo.Record) {
			if r.Topic == events.TopicEvents {
				eventsSeen++
				if ev, err := events.Unmarshal(r.Value); err == nil && events.IsDerived(ev) {
					derived++
					fmt.Fprintf(out, "%s  correlate   %-14q %s on %q (%s)\n", time.Now().Format("15:04:05"),
						ev.GetDerivedBy(), verdict(ev.GetIsHealthy()), ev.GetNodeName(), ev.GetRecommendedAction())
				}
				return
			}
			a, err := events.UnmarshalAction(r.Value)
			if err != nil {
				return
			}
			key := a.GetKind() + "/" + a.GetOutcome()
			totals[key]++
			if a.GetKind() == "event" {
				return // non-fatal events on the node: counted, not printed
			}
			// Every string is quoted: a node, check or reason that came from a
			// client cannot forge a line of this output.
			fmt.Fprintf(out, "%s  %-11q %-30q %-14q %q %q\n", time.Now().Format("15:04:05"), a.GetRole(), key,
				a.GetNode(), a.GetCheckName(), a.GetReason())
		})
		select {
		case <-tick.C:
			keys := make([]string, 0, len(totals))
			for k := range totals {
				keys = append(keys, fmt.Sprintf("%q=%d", k, totals[k]))
			}
			sort.Strings(keys)
			fmt.Fprintf(out, "%s  summary: %d events in the log (%d derived); fleet sent %d (%d refused); actions: %s\n",
				time.Now().Format("15:04:05"), eventsSeen, derived, sim.Sent.Load(), sim.Failed.Load(), strings.Join(keys, " "))
		default:
		}
	}
}

func verdict(healthy bool) string {
	if healthy {
		return "recovered"
	}
	return "fired"
}
