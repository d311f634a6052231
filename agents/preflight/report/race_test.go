package report

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestRunStartingBesideAFlush: a run starts on a node while another run's
// Flush looks for earlier runs' spools to send. The new run's directory
// was visible before it was locked: the Flush could lock it, find it
// empty and remove it — the new run then failed to start, or held its
// lock on a removed file, its live spool open to any later Flush to adopt
// and delete. A run's directory holds its lock from the moment it exists.
func TestRunStartingBesideAFlush(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Spool.Dir = t.TempDir()
	cfg.Gateway.Addr, cfg.Gateway.Insecure, cfg.Gateway.TokenFile = "127.0.0.1:1", true, ""
	cfg.Spool.DrainTimeout = time.Second
	log := slog.New(slog.DiscardHandler)
	// A run that died before its directory came into view left this.
	stale := filepath.Join(cfg.Spool.Dir, newPrefix+"run-1-1")
	if err := os.Mkdir(stale, 0o750); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Minute)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}
	other, err := Open(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			other.Flush(ctx)
		}
	}()
	defer func() { cancel(); wg.Wait() }()
	for _, tc := range []struct {
		name string
		runs int
	}{
		{"runs starting one after another", 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			failed, unlocked := 0, 0
			for range tc.runs {
				r, err := Open(cfg, log)
				if err != nil {
					failed++
					continue
				}
				held, herr := r.lock.Stat()
				onDisk, derr := os.Stat(filepath.Join(r.Dir(), ".lock"))
				if herr != nil || derr != nil || !os.SameFile(held, onDisk) {
					unlocked++
				}
				r.Close()
			}
			if failed+unlocked > 0 {
				t.Fatalf("of %d runs, %d could not start and %d held no lock on their directory", tc.runs, failed, unlocked)
			}
			if _, err := os.Stat(stale); !os.IsNotExist(err) {
				t.Errorf("a dead run's unfinished directory is still there: %v", err)
			}
		})
	}
}
