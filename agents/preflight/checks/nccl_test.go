package checks

import (
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestNCCLVerdictUnmeasured: a bandwidth nccl-tests printed as nan, inf or
// a negative number measures nothing; the check fails as unreadable
// output, naming the line and the value, instead of passing (a NaN is
// never below the threshold).
func TestNCCLVerdictUnmeasured(t *testing.T) {
	b, err := os.ReadFile("../nccl/testdata/h100-single-node.log")
	if err != nil {
		t.Fatal(err)
	}
	h100 := string(b)
	cfg := DefaultConfig()
	cfg.NodeName = "gpu-node-1"
	env := &Env{Cfg: cfg, Log: slog.New(slog.DiscardHandler), Echo: io.Discard, Now: time.Now}
	for _, tc := range []struct {
		name, log string
		failed    bool
		code      string
		summary   string
	}{
		{"published log passes", h100, false, "", "passed: bus bandwidth 476.53 GB/s"},
		{"nan at the largest size", strings.NewReplacer("270.63  473.60", "   nan     nan", "272.30  476.53", "   nan     nan").Replace(h100),
			true, CodeNCCLUnreadable, `line 21: busbw (field 8) "nan" is not a bandwidth`},
		{"inf in-place", strings.Replace(h100, "272.30  476.53", "   inf     inf", 1),
			true, CodeNCCLUnreadable, `line 21: in-place busbw (field 12) "inf" is not a bandwidth`},
		{"negative footer, no rows", "# Avg bus bandwidth    : -5\n",
			true, CodeNCCLUnreadable, `line 1: Avg bus bandwidth "-5" is not a bandwidth`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := env.ncclVerdict(NCCLLoopback, output{Text: tc.log}, 10, false, nil)
			if o.Failed != tc.failed || (tc.code != "" && !slices.Contains(o.Codes, tc.code)) || !strings.Contains(o.Summary, tc.summary) {
				t.Fatalf("outcome failed=%v codes=%v summary %q; want failed=%v, code %q, summary containing %q",
					o.Failed, o.Codes, o.Summary, tc.failed, tc.code, tc.summary)
			}
		})
	}
}
