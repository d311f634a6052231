// Package chart renders the Helm chart in deploy/chart/faultline for its
// tests (and the config tests of the binaries): Render runs `helm
// template` with value files and returns the manifests as objects.
package chart

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Dir is the chart's directory.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "faultline")
}

// ValueSets are the value files the tests render and install, by name:
// default (only what has no default), secure (SASL_SSL Kafka, TLS
// ClickHouse cluster, cert-manager, member clusters, every role) and
// cloud (MSK-style OAUTHBEARER, ClickHouse Cloud, no autoscaling, every
// agent check).
func ValueSets() map[string]string {
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "testdata")
	return map[string]string{
		"default": filepath.Join(dir, "default.yaml"),
		"secure":  filepath.Join(dir, "secure.yaml"),
		"cloud":   filepath.Join(dir, "cloud.yaml"),
	}
}

// Helm runs the helm CLI with its state in a temporary home.
func Helm(ctx context.Context, helm string, home string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, helm, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// Render is `helm template RELEASE chart -n NAMESPACE -f FILE... ARGS...`,
// parsed into objects.
func Render(ctx context.Context, helm, home, release, namespace string, valueFiles []string, args ...string) ([]*unstructured.Unstructured, error) {
	a := []string{"template", release, Dir(), "--namespace", namespace}
	for _, f := range valueFiles {
		a = append(a, "-f", f)
	}
	out, err := Helm(ctx, helm, home, append(a, args...)...)
	if err != nil {
		return nil, err
	}
	return Parse(out)
}

// Parse splits a multi-document YAML stream into objects.
func Parse(manifests []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifests), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}

// Find returns the object of that kind and name, or nil.
func Find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

// ConfigTOML returns the config.toml of the ConfigMap named name.
func ConfigTOML(objs []*unstructured.Unstructured, name string) (string, error) {
	cm := Find(objs, "ConfigMap", name)
	if cm == nil {
		return "", fmt.Errorf("no ConfigMap %s", name)
	}
	s, ok, _ := unstructured.NestedString(cm.Object, "data", "config.toml")
	if !ok {
		return "", fmt.Errorf("ConfigMap %s has no config.toml", name)
	}
	return s, nil
}
