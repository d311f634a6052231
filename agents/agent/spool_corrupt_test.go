package agent

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestSpoolCorruptRecordLosesOnlyItself: one damaged record in the middle
// of a segment (a bad sector, a flipped bit) costs that record, not the
// events after it. The rest of its segment was skipped when read — up to
// 4 MiB of unsent events — and, in the newest segment, cut off the disk
// at the next start as if it were a torn tail.
func TestSpoolCorruptRecordLosesOnlyItself(t *testing.T) {
	for _, tc := range []struct {
		name    string
		damage  func(rec []byte) // rec: the whole record, header included
		reopen  bool
		segment int // which segment holds the damaged record (-1: the newest)
	}{
		{"payload bit flipped, read", func(r []byte) { r[recordHeader+3] ^= 0x40 }, false, -1},
		{"payload bit flipped, after a restart", func(r []byte) { r[recordHeader+3] ^= 0x40 }, true, -1},
		{"length damaged, after a restart", func(r []byte) { binary.BigEndian.PutUint32(r, 1<<30) }, true, -1},
		{"checksum damaged, older segment", func(r []byte) { r[5] ^= 0xff }, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			sp, err := OpenSpool(dir, 64<<10, quiet(), NewMetrics()) // 8 KiB segments
			if err != nil {
				t.Fatal(err)
			}
			defer func() { sp.Close() }()
			var want []string
			for i := range 300 {
				m := fmt.Sprintf("e%03d %s", i, strings.Repeat("x", 60))
				want = append(want, m)
				if err := sp.AppendAll([]*datamodels.HealthEvent{ev(m, true)}); err != nil {
					t.Fatal(err)
				}
			}
			segs, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
			if len(segs) < 2 {
				t.Fatalf("segments %v", segs)
			}
			seg := segs[len(segs)-1]
			if tc.segment >= 0 {
				seg = segs[tc.segment]
			}
			b, err := os.ReadFile(seg)
			if err != nil {
				t.Fatal(err)
			}
			// Damage the third record of the segment.
			var off int
			for range 2 {
				off += recordHeader + int(binary.BigEndian.Uint32(b[off:]))
			}
			n := recordHeader + int(binary.BigEndian.Uint32(b[off:]))
			ev := &datamodels.HealthEvent{}
			if err := ev.UnmarshalVT(b[off+recordHeader : off+n]); err != nil {
				t.Fatal(err)
			}
			lost := ev.GetMessage()
			tc.damage(b[off : off+n])
			if err := os.WriteFile(seg, b, 0o640); err != nil {
				t.Fatal(err)
			}
			if tc.reopen {
				sp.Close()
				if sp, err = OpenSpool(dir, 64<<10, quiet(), NewMetrics()); err != nil {
					t.Fatal(err)
				}
			}
			got, _, err := sp.Peek(1000)
			if err != nil {
				t.Fatal(err)
			}
			var kept []string
			for _, m := range want {
				if m != lost {
					kept = append(kept, m)
				}
			}
			if g := msgs(got); strings.Join(g, "|") != strings.Join(kept, "|") {
				t.Fatalf("read back %d events, want the %d but the damaged %.4s", len(g), len(kept), lost)
			}
		})
	}
}
