package conformance

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	agentconf "github.com/faultline/faultline/agents/conformance"
	"github.com/faultline/faultline/internal/clickhouse"
	"github.com/faultline/faultline/processors/pipeline"
)

// Handler stores the NodeConformance reports of the events topic in
// ClickHouse's conformance table; every other event is passed over (the
// store role keeps them, and dead-letters the records that do not decode).
type Handler struct {
	pipeline.Ownership
	conn clickhouse.Conn
	log  *slog.Logger
	now  func() time.Time
}

// NewHandler returns the report writer.
func NewHandler(conn clickhouse.Conn, log *slog.Logger, now func() time.Time) *Handler {
	if now == nil {
		now = time.Now
	}
	return &Handler{Ownership: pipeline.Ownership{Topic: Topics[0]}, conn: conn, log: log, now: now}
}

var fpRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Columns of the conformance table the handler writes.
const insertColumns = "cluster, node, ts, ts_ms, id, fingerprint, components.name, components.version, received"

// Handle writes the batch's reports in one insert. A NodeConformance event
// without a valid fingerprint is dead (with the reason).
func (h *Handler) Handle(ctx context.Context, recs []*kgo.Record) (pipeline.Result, error) {
	evs, _ := pipeline.DecodeEvents(recs) // undecodable records: the store role dead-letters them
	var (
		res                   pipeline.Result
		cluster, node, id, fp []string
		ts, received          []time.Time
		tsMS                  []uint16
		names, versions       [][]string
	)
	for _, e := range evs {
		ev := e.Event
		if ev.GetCheckName() != agentconf.CheckName || ev.GetDerivedBy() != "" {
			continue
		}
		f := ev.GetMetadata()[agentconf.MetaFingerprint]
		if !fpRE.MatchString(f) {
			res.Dead = append(res.Dead, pipeline.Dead{Record: e.Rec, Reason: fmt.Errorf("conformance: metadata.fingerprint: want 64 lower-case hex digits, got %q", trunc(f))})
			continue
		}
		at := ev.GetGeneratedTimestamp().AsTime()
		if ev.GetGeneratedTimestamp() == nil {
			at = ev.GetReceivedTimestamp().AsTime()
		}
		rcv := ev.GetReceivedTimestamp().AsTime()
		if ev.GetReceivedTimestamp() == nil {
			rcv = h.now()
		}
		var ns, vs []string
		for k, v := range ev.GetMetadata() {
			if n, ok := strings.CutPrefix(k, agentconf.MetaComponentPrefix); ok {
				ns = append(ns, n)
			}
			_ = v
		}
		sort.Strings(ns)
		for _, n := range ns {
			vs = append(vs, ev.GetMetadata()[agentconf.MetaComponentPrefix+n])
		}
		cluster = append(cluster, e.Cluster)
		node = append(node, e.Node)
		ts = append(ts, clampDT(at))
		tsMS = append(tsMS, uint16(at.Nanosecond()/1e6))
		id = append(id, ev.GetId())
		fp = append(fp, f)
		names = append(names, ns)
		versions = append(versions, vs)
		received = append(received, clampDT(rcv))
	}
	if len(cluster) == 0 {
		return res, nil
	}
	batch, err := h.conn.PrepareBatch(ctx, "INSERT INTO conformance ("+insertColumns+")")
	if err != nil {
		return res, fmt.Errorf("conformance: insert: %w", err)
	}
	defer batch.Close()
	for i, col := range []any{cluster, node, ts, tsMS, id, fp, names, versions, received} {
		if err := batch.Column(i).Append(col); err != nil {
			return res, fmt.Errorf("conformance: insert column %d: %w", i, err)
		}
	}
	if err := batch.Send(); err != nil {
		return res, fmt.Errorf("conformance: insert %d reports: %w", len(cluster), err)
	}
	return res, nil
}

func clampDT(t time.Time) time.Time {
	if t.Unix() < 0 {
		return time.Unix(0, 0).UTC()
	}
	return t.UTC()
}

func trunc(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
