package main

import (
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
)

// nvmlNeeds are the glibc libraries NVIDIA's driver libraries such as
// libnvidia-ml.so.1 are linked against (glibc 2.34 and later keep libdl,
// libpthread and librt as stubs for them): the NVIDIA container runtime
// injects libnvidia-ml.so.1 into the agent's container at run time, and
// the image must carry what it needs. (Not checked against a real driver
// here: no GPU machine was lent.)
var nvmlNeeds = []string{"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1"}

// cgoFor reports whether spec's binary is built with cgo on this machine:
// only an image that needs it (NVML), for this machine's platform (cgo
// across platforms needs a cross C toolchain) and with a C compiler; why
// not otherwise.
func cgoFor(spec Spec, goos, goarch string) (bool, string) {
	switch {
	case !spec.NVML:
		return false, ""
	case goos != runtime.GOOS || goarch != runtime.GOARCH:
		return false, fmt.Sprintf("static build for %s/%s (cgo is built for this machine's platform only): the gpu check reports NVML unavailable", goos, goarch)
	case cCompiler() == "":
		return false, "static build (no C compiler: install gcc): the gpu check reports NVML unavailable"
	}
	return true, ""
}

// cCompiler is the path of go's C compiler, or "" when there is none.
func cCompiler() string {
	cc := "gcc"
	if b, err := exec.Command("go", "env", "CC").Output(); err == nil && strings.TrimSpace(string(b)) != "" {
		cc = strings.Fields(string(b))[0]
	}
	p, err := exec.LookPath(cc)
	if err != nil {
		return ""
	}
	return p
}

// libDirs are where the libraries are looked for on the build machine,
// and where they go in the image (the loader's default directories).
func libDirs() []string {
	multiarch := map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}[runtime.GOARCH]
	dirs := []string{"/lib64", "/usr/lib64", "/lib", "/usr/lib"}
	if multiarch != "" {
		dirs = append([]string{"/lib/" + multiarch, "/usr/lib/" + multiarch}, dirs...)
	}
	return dirs
}

// findLib is the path of the library name in the first of dirs that has
// it, "" if none does.
func findLib(dirs []string, name string) string {
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, name)); err == nil {
			return filepath.Join(d, name)
		}
	}
	return ""
}

// elfInterp is the binary's ELF interpreter (its loader), "" if static.
func elfInterp(ef *elf.File) (string, error) {
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				return "", fmt.Errorf("reading the binary's interpreter: %w", err)
			}
			return string(bytes.TrimRight(b, "\x00")), nil
		}
	}
	return "", nil
}

// runtimeFiles returns what a dynamically linked binary needs in an empty
// image: its ELF interpreter and the libraries it names (DT_NEEDED), plus
// nvmlNeeds, copied from this machine to the paths the loader looks in.
// A static binary needs none.
func runtimeFiles(bin []byte) ([]file, error) {
	ef, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		return nil, fmt.Errorf("reading the binary: %w", err)
	}
	interp, err := elfInterp(ef)
	if err != nil || interp == "" {
		return nil, err
	}
	needed, err := ef.ImportedLibraries()
	if err != nil {
		return nil, fmt.Errorf("reading the binary's libraries: %w", err)
	}
	paths := map[string]bool{interp: true}
	dirs := libDirs()
	for _, lib := range append(needed, nvmlNeeds...) {
		found := findLib(dirs, lib)
		if found == "" {
			return nil, fmt.Errorf("%s not found in %s", lib, strings.Join(dirs, ", "))
		}
		paths[found] = true
	}
	var files []file
	parents := map[string]bool{}
	for p := range paths {
		data, err := os.ReadFile(p) // a symlink's target, as a file
		if err != nil {
			return nil, err
		}
		files = append(files, file{path: strings.TrimPrefix(p, "/"), mode: 0o755, data: data})
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			parents[strings.TrimPrefix(d, "/")+"/"] = true
		}
	}
	for d := range parents {
		files = append(files, file{path: d, mode: 0o755, dir: true})
	}
	sort.Slice(files, func(i, j int) bool { return files[i].path < files[j].path })
	return files, nil
}
