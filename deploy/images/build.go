package main

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Spec is one image: the Go package of its binary and how it is described.
type Spec struct {
	Name        string // image and binary name
	Package     string // Go package path relative to the module root
	Description string
	// NVML: the binary loads libnvidia-ml.so.1 at run time (the agent's
	// gpu check), so it is built with cgo and the image carries glibc.
	NVML bool
}

// Specs are the images `make images` builds.
var Specs = map[string]Spec{
	"faultline": {Name: "faultline", Package: "./cmd/faultline",
		Description: "faultline gateway, processor roles, migrations and queries"},
	"faultline-agent": {Name: "faultline-agent", Package: "./agents/cmd/faultline-agent",
		Description: "faultline node agent (DaemonSet)", NVML: true},
	"faultline-preflight": {Name: "faultline-preflight", Package: "./agents/cmd/faultline-preflight",
		Description: "faultline preflight admission webhook and checks"},
}

// Names lists the images, sorted.
func Names() []string {
	out := make([]string, 0, len(Specs))
	for n := range Specs {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Options are the inputs shared by every image.
type Options struct {
	ModuleRoot string
	Version    string
	Revision   string
	Platform   string // os/arch
	Repository string
	Source     string
	CABundle   string
	Created    time.Time
}

// Result is what Build wrote.
type Result struct {
	Ref    string // repository/name:version
	Digest v1.Hash
	Layout string // OCI layout directory
	Tar    string // docker-save tarball
	Note   string // what the build left out, if anything (NVML)
}

const (
	// UID and GID of the images' user, "nonroot" (distroless's number).
	UID = 65532
	// BinDir holds the binary; the entrypoint is BinDir/Name.
	BinDir = "/usr/local/bin"
)

// Build compiles spec's binary and writes its image under out.
func Build(ctx context.Context, spec Spec, o Options, out string) (Result, error) {
	goos, goarch, ok := strings.Cut(o.Platform, "/")
	if !ok || goos == "" || goarch == "" {
		return Result{}, fmt.Errorf("--platform: %q is not OS/ARCH", o.Platform)
	}
	cgo, note := cgoFor(spec, goos, goarch)
	bin, err := compile(ctx, spec, o, goos, goarch, cgo)
	if err != nil {
		return Result{}, err
	}
	var libs []file
	if cgo {
		if libs, err = runtimeFiles(bin); err != nil {
			return Result{}, fmt.Errorf("%s's libraries: %w", spec.Name, err)
		}
	}
	ca, err := os.ReadFile(o.CABundle)
	if err != nil {
		return Result{}, fmt.Errorf("--ca-bundle: %w", err)
	}
	img, err := Image(spec, o, goos, goarch, bin, libs, ca)
	if err != nil {
		return Result{}, err
	}
	ref, err := name.NewTag(fmt.Sprintf("%s/%s:%s", o.Repository, spec.Name, tagOf(o.Version)))
	if err != nil {
		return Result{}, fmt.Errorf("image reference: %w", err)
	}
	res := Result{Ref: ref.String(), Layout: filepath.Join(out, spec.Name), Tar: filepath.Join(out, spec.Name+".tar"), Note: note}
	if res.Digest, err = img.Digest(); err != nil {
		return Result{}, err
	}
	// A layout is appended to, so start from an empty one: the same image
	// gives the same index.json.
	if err := os.RemoveAll(res.Layout); err != nil {
		return Result{}, err
	}
	p, err := layout.Write(res.Layout, empty.Index)
	if err != nil {
		return Result{}, fmt.Errorf("OCI layout: %w", err)
	}
	// ref.name is the tag (skopeo oci:DIR:TAG); containerd's import reads
	// its own annotation for the full name.
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": ref.TagStr(),
		"io.containerd.image.name":          ref.String(),
	}), layout.WithPlatform(v1.Platform{OS: goos, Architecture: goarch})); err != nil {
		return Result{}, fmt.Errorf("OCI layout: %w", err)
	}
	if err := tarball.WriteToFile(res.Tar, ref, img); err != nil {
		return Result{}, fmt.Errorf("tarball: %w", err)
	}
	return res, nil
}

// tagOf makes a version a valid tag ("v1.2.3+dirty" → "v1.2.3_dirty").
func tagOf(v string) string {
	var b strings.Builder
	for i, r := range v {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_',
			i > 0 && (r == '.' || r == '-'):
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	s := b.String()
	if len(s) > 128 {
		s = s[:128]
	}
	return s
}

// compile builds the binary (static unless cgo) and returns its bytes.
func compile(ctx context.Context, spec Spec, o Options, goos, goarch string, cgo bool) ([]byte, error) {
	dir, err := os.MkdirTemp("", "faultline-images-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	outFile := filepath.Join(dir, spec.Name)
	const vpkg = "github.com/faultline/faultline/internal/version"
	ldflags := fmt.Sprintf("-s -w -buildid= -X %s.Version=%s -X %s.Revision=%s", vpkg, o.Version, vpkg, o.Revision)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", outFile, spec.Package)
	cmd.Dir = o.ModuleRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED="+cgoEnabled(cgo), "GOOS="+goos, "GOARCH="+goarch)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go build %s: %w: %s", spec.Package, err, strings.TrimSpace(stderr.String()))
	}
	return os.ReadFile(outFile)
}

func cgoEnabled(cgo bool) string {
	if cgo {
		return "1"
	}
	return "0"
}

// Image assembles the image from the binary, the files a cgo binary needs
// (libs: its loader and glibc, runtimeFiles; none for a static one) and the
// CA bundle: a base layer (users, CA bundle, /tmp), the libraries' layer,
// and the binary's layer, the config naming the entrypoint, user and
// labels. Pure: the same arguments give the same digest.
func Image(spec Spec, o Options, goos, goarch string, bin []byte, libs []file, ca []byte) (v1.Image, error) {
	// The layers, bottom up, each with the history line that says what it is.
	type part struct {
		files []file
		by    string
	}
	parts := []part{{baseFiles(ca), "base (nonroot user 65532, CA bundle, /tmp)"}}
	if len(libs) > 0 {
		parts = append(parts, part{libs, "the ELF loader and glibc of the build machine (the binary is cgo: NVML)"})
	}
	parts = append(parts, part{[]file{
		{path: "usr/", mode: 0o755, dir: true},
		{path: "usr/local/", mode: 0o755, dir: true},
		{path: "usr/local/bin/", mode: 0o755, dir: true},
		{path: "usr/local/bin/" + spec.Name, mode: 0o755, data: bin},
	}, BinDir + "/" + spec.Name + " (go build " + spec.Package + ", CGO_ENABLED=" + cgoEnabled(len(libs) > 0) + ")"})
	var adds []mutate.Addendum
	for _, p := range parts {
		l, err := layer(p.files, o.Created)
		if err != nil {
			return nil, err
		}
		adds = append(adds, mutate.Addendum{Layer: l, MediaType: types.OCILayer, History: v1.History{
			Created: v1.Time{Time: o.Created}, CreatedBy: "faultline images: " + p.by, Comment: "deploy/images"}})
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.Append(img, adds...)
	if err != nil {
		return nil, err
	}
	labels := map[string]string{
		"org.opencontainers.image.title":       spec.Name,
		"org.opencontainers.image.description": spec.Description,
		"org.opencontainers.image.source":      o.Source,
		"org.opencontainers.image.url":         o.Source,
		"org.opencontainers.image.version":     o.Version,
		"org.opencontainers.image.revision":    o.Revision,
		"org.opencontainers.image.created":     o.Created.UTC().Format(time.RFC3339),
		"org.opencontainers.image.licenses":    "Apache-2.0",
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = goos, goarch
	cf.Created = v1.Time{Time: o.Created}
	cf.Author = "faultline"
	cf.Config = v1.Config{
		Entrypoint: []string{BinDir + "/" + spec.Name},
		User:       fmt.Sprintf("%d:%d", UID, UID),
		WorkingDir: "/",
		Env: []string{
			"PATH=/usr/local/bin:/usr/bin:/bin",
			"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
		},
		Labels: labels,
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, err
	}
	return mutate.Annotations(img, labels).(v1.Image), nil
}

// baseFiles are the empty base's files: the users, the CA bundle and /tmp.
func baseFiles(ca []byte) []file {
	return []file{
		{path: "etc/", mode: 0o755, dir: true},
		{path: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{path: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{path: "etc/ssl/", mode: 0o755, dir: true},
		{path: "etc/ssl/certs/", mode: 0o755, dir: true},
		{path: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, data: ca},
		{path: "home/", mode: 0o755, dir: true},
		{path: "home/nonroot/", mode: 0o700, dir: true, uid: UID},
		{path: "root/", mode: 0o700, dir: true},
		{path: "tmp/", mode: 0o1777, dir: true},
	}
}

type file struct {
	path string
	mode int64
	dir  bool
	uid  int
	data []byte
}

// layer writes files into a tar with fixed owners and times; the layer is
// gzip-compressed by go-containerregistry (deterministic for a given Go).
func layer(files []file, mtime time.Time) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.path, Mode: f.mode, Uid: f.uid, Gid: f.uid, ModTime: mtime, Format: tar.FormatPAX}
		if f.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if f.uid == UID {
			h.Uname, h.Gname = "nonroot", "nonroot"
		} else {
			h.Uname, h.Gname = "root", "root"
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithMediaType(types.OCILayer))
}
