package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMachineID: the system UUID is copied readable by all; a sysfs
// without one is said and stops nothing (no copy: the agent stamps none);
// an out that cannot be written fails the init container.
func TestMachineID(t *testing.T) {
	const uuid = "4C4C4544-0042-3510-8052-B4C04F4D3732"
	for _, tc := range []struct {
		name    string
		uuid    string // in the sysfs; "" none
		badOut  bool   // out is a file
		aside   bool   // a read-only copy aside, left by a run killed before its rename
		want    string // the copy; "" none
		wantErr string
		wantSay string // on stderr
	}{
		{name: "copied", uuid: uuid + "\n", want: uuid + "\n"},
		{name: "no DMI", wantSay: "the agent's events carry no machine"},
		{name: "empty product_uuid", uuid: "\n", wantSay: "none readable"},
		{name: "out not a directory", uuid: uuid, badOut: true, wantErr: "machine-id: mkdir"},
		// Root without CAP_DAC_OVERRIDE (the chart's init container) cannot
		// open a read-only file again: it is removed, not reopened.
		{name: "read-only copy aside", uuid: uuid + "\n", aside: true, want: uuid + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sys, out := t.TempDir(), filepath.Join(t.TempDir(), "machine")
			if tc.uuid != "" {
				if err := os.MkdirAll(filepath.Join(sys, filepath.Dir(productUUID)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(sys, productUUID), []byte(tc.uuid), 0o400); err != nil {
					t.Fatal(err)
				}
			}
			if tc.badOut {
				if err := os.WriteFile(out, nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if tc.aside {
				if err := os.MkdirAll(filepath.Join(out, filepath.Dir(productUUID)), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(out, productUUID+".tmp"), []byte("half"), 0o444); err != nil {
					t.Fatal(err)
				}
			}
			var stdout, stderr bytes.Buffer
			err := dispatch(context.Background(), []string{"machine-id", "--sysfs", sys, "--out", out}, &stdout, &stderr)
			if (err != nil) != (tc.wantErr != "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err %v, want %q", err, tc.wantErr)
			}
			if !strings.Contains(stderr.String(), tc.wantSay) {
				t.Errorf("stderr %q lacks %q", stderr.String(), tc.wantSay)
			}
			b, err := os.ReadFile(filepath.Join(out, productUUID))
			if string(b) != tc.want || (tc.want == "") != (err != nil) {
				t.Fatalf("copy %q (%v), want %q", b, err, tc.want)
			}
			if _, err := os.Stat(filepath.Join(out, productUUID+".tmp")); err == nil {
				t.Errorf("the copy aside is left behind")
			}
			if fi, err := os.Stat(filepath.Join(out, productUUID)); err == nil && fi.Mode().Perm() != 0o444 {
				t.Errorf("copy mode %v, want readable by all", fi.Mode().Perm())
			}
		})
	}
}
