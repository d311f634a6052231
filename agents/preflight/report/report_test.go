package report

import (
	"log/slog"
	"testing"
	"time"

	"github.com/faultline/faultline/schemas/gen/datamodels"
	"github.com/faultline/faultline/schemas/validate"
)

// TestReportCleansText: a check's event carrying what a tool printed (ANSI
// colours, a stray byte) is spooled in a form the gateway takes.
func TestReportCleansText(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Spool.Dir = t.TempDir()
	r, err := Open(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ev := &datamodels.HealthEvent{Agent: "faultline-preflight", ComponentClass: "GPU", CheckName: "PreflightDCGMDiag", NodeName: "gpu-1",
		Message:  "\x1b[31mFail\x1b[0m: GPU 0 \xff",
		Metadata: map[string]string{"output": "line 1\x00line 2"}}
	if err := r.Report([]*datamodels.HealthEvent{ev}); err != nil {
		t.Fatal(err)
	}
	evs, _, err := r.spool.Peek(1)
	if err != nil || len(evs) != 1 {
		t.Fatalf("spooled %d events: %v", len(evs), err)
	}
	if err := (validate.Validator{MaxBatch: 1, MaxFutureSkew: time.Minute}).Validate(evs[0], time.Now()); err != nil {
		t.Fatalf("spooled event would be refused: %v", err)
	}
	if got, want := evs[0].Message, " [31mFail [0m: GPU 0 ?"; got != want {
		t.Errorf("message %q, want %q", got, want)
	}
}
