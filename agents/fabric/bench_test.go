package fabric

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// BenchmarkFMLog: FM log lines through the reader and the evaluator (a
// field-like mix: multicast team chatter, continuation lines, one SXid
// and one partition line in a hundred).
func BenchmarkFMLog(b *testing.B) {
	var sb strings.Builder
	for i := 0; i < 10000; i++ {
		switch i % 100 {
		case 0:
			fmt.Fprintf(&sb, "[Feb 27 2025 15:10:02] [ERROR] [tid 12727] detected NVSwitch non-fatal error 12028 on fid 0 on NVSwitch pci bus id 00000000:86:00.0 physical id 3 port %d\n", i%64)
		case 1:
			sb.WriteString("[Feb 27 2025 15:10:02] [ERROR] [tid 501] request to activate fabric partition id 5 failed, fmReturn: -5\n")
		default:
			sb.WriteString("[Feb 25 2025 14:01:18] [INFO] [tid 1803] Received an inband message:  Message header details: magic Id:adbc request Id:73a12417a65c5380 status:0 type:2 length:56\n")
			sb.WriteString("Message payload details:Team setup request: Allocation Size:60000000 Flags:0 Number of GPUs:8\n")
		}
	}
	text := sb.String()
	lines := strings.Count(text, "\n")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ev, _ := NewEvaluator(EvalConfig{Platform: PlatformH100})
		s := NewSnapshot(time.Unix(1740000000, 0))
		s.Log = (&LogReader{Loc: time.UTC, Year: 2025}).ReadLog(text)
		ev.Evaluate(s)
	}
	b.ReportMetric(float64(lines)*float64(b.N)/b.Elapsed().Seconds(), "lines/s")
}

// BenchmarkPoll: one steady-state poll of a healthy HGX H100 (the command
// outputs come from the fake runner: this is the check's own cost).
func BenchmarkPoll(b *testing.B) {
	t := &testing.T{}
	n := h100Node(t, nil)
	n.healthy()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		n.now = n.now.Add(30 * time.Second)
		if _, err := n.c.Check(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}
