package main

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// TestImages builds every image twice (`make images`, the real go build),
// reads each back from its OCI layout and its docker tarball the way crane
// does (go-containerregistry), checks the entrypoint, user, platform and
// labels, runs the binary taken out of the image with --version, and
// checks that the second build has the same digest.
func TestImages(t *testing.T) {
	if testing.Short() {
		t.Skip("builds three binaries twice (minutes); skipped under -short")
	}
	if runtime.GOOS != "linux" {
		t.Skip("runs the linux binaries it builds")
	}
	ctx := context.Background()
	first, second := t.TempDir(), t.TempDir()
	args := func(out string) []string {
		return []string{"--out", out, "--version", "v9.8.7-test", "--revision", "0123456789abcdef", "--platform", "linux/" + runtime.GOARCH}
	}
	t.Setenv("SOURCE_DATE_EPOCH", "1700000000")
	var stdout, stderr bytes.Buffer
	if err := run(ctx, args(first), &stdout, &stderr); err != nil {
		t.Fatalf("first build: %v\n%s", err, stderr.String())
	}
	digests := stdout.String()
	stdout.Reset()
	if err := run(ctx, args(second), &stdout, &stderr); err != nil {
		t.Fatalf("second build: %v\n%s", err, stderr.String())
	}
	if stdout.String() != digests {
		t.Errorf("not reproducible: first build\n%s\nsecond build\n%s", digests, stdout.String())
	}
	if lines := strings.Split(strings.TrimSpace(digests), "\n"); len(lines) != len(Specs) {
		t.Fatalf("digests: want %d lines, got %q", len(Specs), digests)
	}
	for _, n := range Names() {
		t.Run(n, func(t *testing.T) {
			checkImage(t, first, n)
		})
	}
}

func checkImage(t *testing.T, dir, imgName string) {
	ref := "ghcr.io/faultline/" + imgName + ":v9.8.7-test"
	// The OCI layout: one manifest, tagged.
	p, err := layout.FromPath(filepath.Join(dir, imgName))
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "v9.8.7-test" ||
		im.Manifests[0].Annotations["io.containerd.image.name"] != ref {
		t.Fatalf("layout index: %+v", im.Manifests)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	if mt, _ := img.MediaType(); mt != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %s", mt)
	}
	// The docker-save tarball holds the same image under its name.
	tag, _ := name.NewTag(ref)
	timg, err := tarball.ImageFromPath(filepath.Join(dir, imgName+".tar"), &tag)
	if err != nil {
		t.Fatalf("tarball: %v", err)
	}
	ld, _ := img.Digest()
	// docker save keeps the config and layers; the manifest is rebuilt
	// (Docker media types), so compare what it is made of.
	lc, _ := img.ConfigName()
	tc, _ := timg.ConfigName()
	if lc != tc {
		t.Errorf("tarball config %s, layout config %s (manifest %s)", tc, lc, ld)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != runtime.GOARCH {
		t.Errorf("platform %s/%s", cf.OS, cf.Architecture)
	}
	entry := "/usr/local/bin/" + imgName
	if len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != entry {
		t.Errorf("entrypoint %q, want [%s]", cf.Config.Entrypoint, entry)
	}
	if cf.Config.User != "65532:65532" {
		t.Errorf("user %q, want 65532:65532", cf.Config.User)
	}
	want := map[string]string{
		"org.opencontainers.image.source":   "https://github.com/faultline/faultline",
		"org.opencontainers.image.version":  "v9.8.7-test",
		"org.opencontainers.image.revision": "0123456789abcdef",
		"org.opencontainers.image.title":    imgName,
		"org.opencontainers.image.created":  "2023-11-14T22:13:20Z",
	}
	for k, v := range want {
		if cf.Config.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, cf.Config.Labels[k], v)
		}
	}
	if !cf.Created.Time.Equal(time.Unix(1700000000, 0)) {
		t.Errorf("created %s, want SOURCE_DATE_EPOCH", cf.Created.Time)
	}
	// The filesystem: the binary, the nonroot user, the CA bundle.
	files := extract(t, img)
	for _, f := range []string{entry, "etc/passwd", "etc/group", "etc/ssl/certs/ca-certificates.crt"} {
		if _, ok := files[strings.TrimPrefix(f, "/")]; !ok {
			t.Errorf("image has no %s", f)
		}
	}
	if !bytes.Contains(files["etc/passwd"].data, []byte("nonroot:x:65532:65532:")) {
		t.Errorf("/etc/passwd has no nonroot 65532: %q", files["etc/passwd"].data)
	}
	bin := files[strings.TrimPrefix(entry, "/")]
	if bin.mode&0o111 == 0 || bin.uid != 0 {
		t.Errorf("%s mode %o uid %d: want executable, owned by root", entry, bin.mode, bin.uid)
	}
	for path, f := range files {
		if !f.mtime.Equal(time.Unix(1700000000, 0)) {
			t.Errorf("%s mtime %s, want SOURCE_DATE_EPOCH", path, f.mtime)
		}
	}
	// The binary runs and answers --version with the version and revision
	// it was built with: a static one as it is; a cgo one (the agent, for
	// NVML) with the image's own loader and libraries only.
	root := t.TempDir()
	for p, f := range files {
		if len(f.data) == 0 {
			continue // a directory
		}
		if err := os.MkdirAll(filepath.Join(root, path.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), f.data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	exe := filepath.Join(root, entry)
	spec := Specs[imgName]
	cmd := exec.Command(exe, "--version")
	if cgo, _ := cgoFor(spec, "linux", runtime.GOARCH); cgo {
		inImage := imageLoader(t, root, bin.data, exe)
		cmd = inImage("--version")
		if !strings.Contains(cf.History[len(cf.History)-1].CreatedBy, "CGO_ENABLED=1") {
			t.Errorf("%s's layer history %q, want CGO_ENABLED=1", imgName, cf.History[len(cf.History)-1].CreatedBy)
		}
		// NVML is reached: no library here (or the machine's, on a GPU
		// machine), not "built without cgo".
		out, err := inImage("gpu", "check").CombinedOutput()
		if err != nil && !bytes.Contains(out, []byte("no NVIDIA GPU or driver")) {
			t.Errorf("%s gpu check in its image: %v: %s", imgName, err, out)
		}
		injectedNVML(t, root, inImage)
	} else if fo, err := exec.Command("file", exe).Output(); err == nil && !bytes.Contains(fo, []byte("statically linked")) {
		t.Errorf("binary is not static: %s", fo)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v: %s", imgName, err, out)
	}
	if wantOut := imgName + " v9.8.7-test (revision 0123456789abcdef, "; !strings.HasPrefix(string(out), wantOut) {
		t.Errorf("%s --version = %q, want prefix %q", imgName, out, wantOut)
	}
}

// imageLoader returns how to run exe (extracted under root) with the
// loader and libraries of its image only, after checking that the image
// holds every library the binary names and those NVML's library needs, and
// that the loader resolves each of them under root.
func imageLoader(t *testing.T, root string, bin []byte, exe string) func(args ...string) *exec.Cmd {
	t.Helper()
	ef, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		t.Fatal(err)
	}
	interp, err := elfInterp(ef)
	if err != nil || interp == "" {
		t.Fatalf("a cgo binary's ELF interpreter: %q, %v", interp, err)
	}
	needed, _ := ef.ImportedLibraries()
	var dirs []string
	for _, d := range libDirs() {
		dirs = append(dirs, filepath.Join(root, d))
	}
	for _, lib := range append(needed, nvmlNeeds...) {
		if findLib(dirs, lib) == "" {
			t.Errorf("the image has no %s (needed by %s)", lib, map[bool]string{true: "the binary", false: "libnvidia-ml.so.1"}[slices.Contains(needed, lib)])
		}
	}
	loader := filepath.Join(root, interp)
	only := []string{"--inhibit-cache", "--library-path", strings.Join(dirs, ":")} // the image's libraries, no others
	list, err := exec.Command(loader, append(only, "--list", exe)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s --list: %v: %s", loader, err, list)
	}
	for _, l := range strings.Split(strings.TrimSpace(string(list)), "\n") {
		if _, resolved, ok := strings.Cut(l, "=> "); ok && !strings.HasPrefix(resolved, root) {
			t.Errorf("the image's loader resolves %q outside the image", strings.TrimSpace(l))
		}
	}
	return func(args ...string) *exec.Cmd {
		return exec.Command(loader, append(append(slices.Clone(only), exe), args...)...)
	}
}

// fakeNVML is a libnvidia-ml.so.1 with the calls the gpu check makes on a
// node without GPUs, linked against what NVIDIA's is (libc, libm, libdl,
// libpthread, librt).
const fakeNVML = `
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 0; return 0; }
const char *nvmlErrorString(int r) { return "fake"; }
`

// injectedNVML puts a fake libnvidia-ml.so.1 where the NVIDIA container
// runtime injects the real one and runs the agent's gpu check with it: the
// library and everything it is linked against must load from the image
// (LD_DEBUG=libs names every library it initialises), and the check must
// report no incidents.
func injectedNVML(t *testing.T, root string, inImage func(args ...string) *exec.Cmd) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "nvml.c")
	if err := os.WriteFile(src, []byte(fakeNVML), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, libDirs()[1]) // /usr/lib/<multiarch>
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(dir, "libnvidia-ml.so.1")
	if out, err := exec.Command(cCompiler(), "-shared", "-fPIC", "-o", lib, src, "-Wl,--no-as-needed", "-lm", "-ldl", "-lpthread", "-lrt").CombinedOutput(); err != nil {
		t.Fatalf("building the fake libnvidia-ml.so.1: %v: %s", err, out)
	}
	defer os.Remove(lib)
	cmd := inImage("gpu", "check")
	cmd.Env = append(os.Environ(), "LD_DEBUG=libs")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("gpu check with an injected libnvidia-ml.so.1: %v: %s", err, stderr.String())
	}
	if got := strings.TrimSpace(stdout.String()); got != "[]" {
		t.Errorf("gpu check with an injected libnvidia-ml.so.1 (no GPUs) = %q, want []", got)
	}
	// (glibc's libdl, libpthread and librt are stubs without an init:
	// imageLoader checked they are in the image, ahead of the machine's
	// directories on the library path.)
	for _, l := range strings.Split(stderr.String(), "\n") {
		if _, p, ok := strings.Cut(l, "calling init: "); ok && !strings.HasPrefix(p, root) {
			t.Errorf("%s loaded from outside the image", p)
		}
	}
	if !strings.Contains(stderr.String(), "calling init: "+lib) {
		t.Errorf("the fake libnvidia-ml.so.1 was not loaded:\n%s", stderr.String())
	}
}

type entry struct {
	data  []byte
	mode  int64
	uid   int
	mtime time.Time
}

// extract reads the image's flattened filesystem.
func extract(t *testing.T, img v1.Image) map[string]entry {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	out := map[string]entry{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimSuffix(h.Name, "/")] = entry{data: b, mode: h.Mode, uid: h.Uid, mtime: h.ModTime}
	}
}

// TestImagePure checks reproducibility without the go build: the same
// inputs give the same digest, a different binary a different one.
func TestImagePure(t *testing.T) {
	o := Options{Version: "v1", Revision: "r", Source: "s", Created: time.Unix(1, 0)}
	spec := Specs["faultline"]
	a, err := Image(spec, o, "linux", "amd64", []byte("bin"), nil, []byte("ca"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Image(spec, o, "linux", "amd64", []byte("bin"), nil, []byte("ca"))
	c, _ := Image(spec, o, "linux", "amd64", []byte("bin2"), nil, []byte("ca"))
	da, _ := a.Digest()
	db, _ := b.Digest()
	dc, _ := c.Digest()
	if da != db {
		t.Errorf("same inputs, digests %s and %s", da, db)
	}
	if da == dc {
		t.Errorf("different binary, same digest %s", da)
	}
}

func TestTagOf(t *testing.T) {
	for in, want := range map[string]string{"v1.2.3": "v1.2.3", "v1.2.3+dirty": "v1.2.3_dirty", "-x": "_x", "109c54c-dirty": "109c54c-dirty"} {
		if got := tagOf(in); got != want {
			t.Errorf("tagOf(%q) = %q, want %q", in, got, want)
		}
	}
}
