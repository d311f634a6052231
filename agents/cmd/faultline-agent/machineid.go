package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/prometheus/procfs/sysfs"
)

// productUUID is where sysfs's DMI class keeps the system UUID, relative to
// a sysfs root: what the agent's machine_sysfs reads (agents/agent).
const productUUID = "class/dmi/id/product_uuid"

// machineIDCmd is `faultline-agent machine-id --sysfs DIR --out DIR`: it
// copies the machine's system UUID (DIR/class/dmi/id/product_uuid, root's
// alone) to the same path under out, readable by all. The chart runs it in
// an init container, as root with no capabilities, before an agent that
// runs as a non-root user and reads out as its machine_sysfs: that agent
// then stamps its events with the machine too. A UUID that cannot be read
// (no DMI, as on some Arm servers) is said here and stops nothing (the
// agent stamps none, and says so); only an out that cannot be written fails.
func machineIDCmd(_ context.Context, args []string, stdout, stderr io.Writer) error {
	flags := flag.NewFlagSet("faultline-agent machine-id", flag.ContinueOnError)
	flags.SetOutput(stderr)
	sys := flags.String("sysfs", "/sys", "the sysfs to read the system UUID from")
	out := flags.String("out", "", "the directory to copy it into (the agent's machine_sysfs)")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *out == "" || flags.NArg() > 0 {
		return errors.New("machine-id: --out is required, and takes no arguments")
	}
	uuid, readErr := readProductUUID(*sys)
	if readErr != nil {
		_, err := fmt.Fprintf(stderr, "machine-id: %v: the agent's events carry no machine\n", readErr)
		return err
	}
	dst := filepath.Join(*out, productUUID)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("machine-id: %w", err)
	}
	// Written aside and renamed: an agent never reads half a UUID. A file
	// aside left by a run killed before its rename is read-only, and root
	// without CAP_DAC_OVERRIDE (the chart drops every capability) cannot
	// open it again: removed first, or every rerun failed.
	tmp := dst + ".tmp"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("machine-id: %w", err)
	}
	if err := os.WriteFile(tmp, []byte(uuid+"\n"), 0o444); err != nil {
		return fmt.Errorf("machine-id: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("machine-id: %w", err)
	}
	_, err := fmt.Fprintf(stdout, "system UUID %s (from %s) copied to %s\n", uuid, *sys, dst)
	return err
}

// readProductUUID reads the system UUID with prometheus/procfs, as the
// agent does; the agent judges whether it is one.
func readProductUUID(sys string) (string, error) {
	fs, err := sysfs.NewFS(sys)
	if err != nil {
		return "", err
	}
	dmi, err := fs.DMIClass()
	if err != nil {
		return "", err
	}
	if dmi.ProductUUID == nil || strings.TrimSpace(*dmi.ProductUUID) == "" {
		return "", fmt.Errorf("%s: none readable", filepath.Join(sys, productUUID))
	}
	return strings.TrimSpace(*dmi.ProductUUID), nil
}
