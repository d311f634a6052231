// Command images builds the OCI images of faultline, faultline-agent and
// faultline-preflight without a container daemon (`make images`): each is
// a binary appended, with go-containerregistry, to an empty base that
// holds only /etc/passwd and /etc/group (user nonroot, 65532), a CA bundle
// and /tmp. The binaries are static (CGO_ENABLED=0) except the agent's,
// built with cgo for its gpu check (NVML, loaded at run time) when the
// platform is this machine's and a C compiler is present; its image adds
// the ELF loader and glibc of the build machine. Images are reproducible:
// every timestamp is SOURCE_DATE_EPOCH (default: the commit time of HEAD),
// so the same sources, Go toolchain, CA bundle (and, for the agent, glibc)
// give the same digest.
//
//	go run ./deploy/images [--out bin/images] [--version V] [--revision R]
//	    [--platform linux/amd64] [--repository ghcr.io/faultline] [--only faultline,...]
//
// For each image NAME it writes an OCI image layout, OUT/NAME (skopeo
// oci:OUT/NAME, crane push OUT/NAME), and a `docker save` tarball,
// OUT/NAME.tar (docker load, skopeo docker-archive:, crane push), and it
// prints "NAME REF DIGEST" lines, also written to OUT/digests.txt.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	opts := Options{}
	fs := flag.NewFlagSet("images", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "bin/images", "output directory")
	only := fs.String("only", "", "comma-separated images to build (default all: "+strings.Join(Names(), ",")+")")
	fs.StringVar(&opts.Version, "version", "", "version label and tag (default: git describe --tags --always --dirty, else dev)")
	fs.StringVar(&opts.Revision, "revision", "", "source revision label (default: git rev-parse HEAD)")
	fs.StringVar(&opts.Platform, "platform", "linux/amd64", "OS/ARCH of the images")
	fs.StringVar(&opts.Repository, "repository", "ghcr.io/faultline", "registry and namespace the image names are tagged under")
	fs.StringVar(&opts.Source, "source", "https://github.com/faultline/faultline", "org.opencontainers.image.source label")
	fs.StringVar(&opts.CABundle, "ca-bundle", "/etc/ssl/certs/ca-certificates.crt", "PEM CA bundle copied to /etc/ssl/certs/ca-certificates.crt")
	if err := fs.Parse(args); err != nil {
		return err
	}
	root, err := moduleRoot(ctx)
	if err != nil {
		return err
	}
	opts.ModuleRoot = root
	if opts.Version == "" {
		opts.Version = gitOr(ctx, root, "dev", "describe", "--tags", "--always", "--dirty")
	}
	if opts.Revision == "" {
		opts.Revision = gitOr(ctx, root, "unknown", "rev-parse", "HEAD")
	}
	if opts.Created, err = sourceDateEpoch(ctx, root); err != nil {
		return err
	}
	names := Names()
	if *only != "" {
		names = strings.Split(*only, ",")
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	var lines []string
	for _, n := range names {
		spec, ok := Specs[strings.TrimSpace(n)]
		if !ok {
			return fmt.Errorf("--only: unknown image %q (known: %s)", n, strings.Join(Names(), ", "))
		}
		res, err := Build(ctx, spec, opts, *out)
		if err != nil {
			return fmt.Errorf("%s: %w", spec.Name, err)
		}
		if res.Note != "" {
			fmt.Fprintf(stderr, "%s: %s\n", spec.Name, res.Note)
		}
		line := fmt.Sprintf("%s %s %s", spec.Name, res.Ref, res.Digest)
		fmt.Fprintln(stdout, line)
		lines = append(lines, line)
	}
	return os.WriteFile(filepath.Join(*out, "digests.txt"), []byte(strings.Join(lines, "\n")+"\n"), 0o644)
}

func moduleRoot(ctx context.Context) (string, error) {
	b, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(b))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("not inside the faultline module (go env GOMOD is empty)")
	}
	return filepath.Dir(gomod), nil
}

func gitOr(ctx context.Context, dir, fallback string, args ...string) string {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	b, err := cmd.Output()
	if s := strings.TrimSpace(string(b)); err == nil && s != "" {
		return s
	}
	return fallback
}

// sourceDateEpoch is $SOURCE_DATE_EPOCH, else HEAD's commit time, else
// the Unix epoch: the one timestamp written into the images.
func sourceDateEpoch(ctx context.Context, root string) (time.Time, error) {
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH: %q is not a Unix time in seconds", s)
		}
		return time.Unix(n, 0).UTC(), nil
	}
	if n, err := strconv.ParseInt(gitOr(ctx, root, "", "log", "-1", "--format=%ct"), 10, 64); err == nil {
		return time.Unix(n, 0).UTC(), nil
	}
	return time.Unix(0, 0).UTC(), nil
}
