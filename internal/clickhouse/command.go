package clickhouse

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/faultline/faultline/sql"
)

// MigrateCommand is `faultline migrate`: it creates the database if needed
// and applies the pending migrations (ON CLUSTER when c.Cluster is set),
// printing one line per file applied.
// With statusOnly it changes nothing (it creates neither the database nor
// the migrations table, so a read-only user can run it) and prints each
// migration as applied (with when) or pending.
func MigrateCommand(ctx context.Context, c Config, statusOnly bool, stdout io.Writer, log *slog.Logger) error {
	migs, err := LoadMigrations(sql.Migrations, "migrations")
	if err != nil {
		return err
	}
	if statusOnly {
		return migrationStatus(ctx, c, migs, stdout, log)
	}
	if err := EnsureDatabase(ctx, c, log); err != nil {
		return err
	}
	conn, err := Open(ctx, c, log)
	if err != nil {
		return err
	}
	defer conn.Close()
	done, err := MigrateSchema(ctx, conn, c.Schema(), migs, log)
	for _, m := range done {
		fmt.Fprintf(stdout, "applied %s\n", m.File)
	}
	if err != nil {
		return err
	}
	where := "single-server schema"
	if c.Cluster != "" {
		where = "cluster " + c.Cluster + " schema"
	}
	fmt.Fprintf(stdout, "%s: %s up to date (%d migrations, %d applied now)\n", c, where, len(migs), len(done))
	return nil
}

// migrationStatus prints each migration of migs as applied (with when),
// changed or pending in c's database, reading it without changing it; a
// database or migrations table that does not exist is said, and every
// migration is pending.
func migrationStatus(ctx context.Context, c Config, migs []Migration, stdout io.Writer, log *slog.Logger) error {
	conn, err := open(ctx, c, "", log) // the user's default database: c's may not exist
	if err != nil {
		return err
	}
	defer conn.Close()
	applied, missing, err := readAppliedMigrations(ctx, conn, c.Schema())
	if err != nil {
		return err
	}
	if missing != "" {
		fmt.Fprintf(stdout, "%s: nothing applied\n", missing)
	}
	for _, m := range migs {
		a, ok := applied[m.Version]
		switch {
		case !ok:
			fmt.Fprintf(stdout, "pending  %s\n", m.File)
		case a.Checksum != m.Checksum:
			fmt.Fprintf(stdout, "CHANGED  %s (applied %s; the file differs)\n", m.File, a.At.UTC().Format(time.RFC3339))
		default:
			fmt.Fprintf(stdout, "applied  %s (%s)\n", m.File, a.At.UTC().Format(time.RFC3339))
		}
	}
	return nil
}
