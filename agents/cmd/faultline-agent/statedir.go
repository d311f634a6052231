package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// stateDirCmd is `faultline-agent state-dir --dir DIR --owner UID:GID`:
// it gives DIR and everything in it to UID:GID, creating DIR when missing.
// The Helm chart runs it as an init container, as root with only the
// CHOWN and DAC_READ_SEARCH capabilities, before an agent that runs as a
// non-root user: the kubelet creates the state host path (DirectoryOrCreate)
// owned by root, mode 0755, and the agent could not create its spool there.
// Entries already owned by UID:GID are left alone; links are not followed.
func stateDirCmd(_ context.Context, args []string, stdout, stderr io.Writer) error {
	flags := flag.NewFlagSet("faultline-agent state-dir", flag.ContinueOnError)
	flags.SetOutput(stderr)
	dir := flags.String("dir", "", "the agent's state directory (its spool, check state)")
	owner := flags.String("owner", "", "UID:GID the agent runs as")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *dir == "" || flags.NArg() > 0 {
		return errors.New("state-dir: --dir is required, and takes no arguments")
	}
	uid, gid, err := parseOwner(*owner)
	if err != nil {
		return fmt.Errorf("state-dir: --owner: %w", err)
	}
	if err := os.MkdirAll(*dir, 0o750); err != nil {
		return fmt.Errorf("state-dir: %w", err)
	}
	changed := 0
	err = filepath.WalkDir(*dir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok && int(st.Uid) == uid && int(st.Gid) == gid {
			return nil
		}
		changed++
		return os.Lchown(path, uid, gid)
	})
	if err != nil {
		return fmt.Errorf("state-dir: %w", err)
	}
	_, err = fmt.Fprintf(stdout, "%s: %d entries given to %d:%d\n", *dir, changed, uid, gid)
	return err
}

// parseOwner parses "UID:GID" (numbers: the image has no user database).
func parseOwner(s string) (uid, gid int, err error) {
	u, g, ok := strings.Cut(s, ":")
	if !ok {
		return 0, 0, fmt.Errorf("%q: want UID:GID", s)
	}
	if uid, err = strconv.Atoi(u); err == nil {
		gid, err = strconv.Atoi(g)
	}
	if err != nil || uid < 0 || gid < 0 {
		return 0, 0, fmt.Errorf("%q: want UID:GID, two numbers", s)
	}
	return uid, gid, nil
}
