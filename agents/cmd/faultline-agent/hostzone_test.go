package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/faultline/faultline/agents/agent"
	"github.com/faultline/faultline/agents/hostzone"
	"github.com/faultline/faultline/deploy/chart"
	"github.com/faultline/faultline/internal/testenv"
)

// TestHostZoneCopiedForTheAgent: the chart's agent reading a kern.log
// (printed in the host's local time) gets the host's zone without seeing
// the host's /etc. Acting as the kubelet — the host's /etc and the memory
// volume laid out, the host-zone init container run with its args and
// mounts — the agent's rendered config then reads the host's zone from the
// copy: America/Chicago from a link, as a distribution leaves it, and
// Asia/Kolkata from a TZif file named by /etc/timezone.
func TestHostZoneCopiedForTheAgent(t *testing.T) {
	helm := testenv.Helm(t)
	objs, err := chart.Render(context.Background(), helm, t.TempDir(), "faultline", "faultline", []string{chart.ValueSets()["default"]},
		"--set", "agent.checks={kmsg}", "--set", "agent.podResources=false",
		"--set", "agent.config.kmsg.source=file", "--set", "agent.config.kmsg.file=/var/log/kern.log")
	if err != nil {
		t.Fatal(err)
	}
	ds := chart.Find(objs, "DaemonSet", "faultline-agent")
	var initC map[string]any
	inits, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "initContainers")
	for _, c := range inits {
		if c := c.(map[string]any); c["name"] == "host-zone" {
			initC = c
		}
	}
	if initC == nil {
		t.Fatal("no host-zone init container")
	}
	mounts := map[string]string{} // volume → mount path in the init container
	vms, _, _ := unstructured.NestedSlice(initC, "volumeMounts")
	for _, vm := range vms {
		vm := vm.(map[string]any)
		mounts[vm["name"].(string)] = vm["mountPath"].(string)
	}
	conf, _, _ := unstructured.NestedString(chart.Find(objs, "ConfigMap", "faultline-agent").Object, "data", "config.toml")
	tzif, err := os.ReadFile("../../hostzone/testdata/Kolkata.tzif")
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		etc  func(t *testing.T, etc string)
		want string
	}{
		{"link", func(t *testing.T, etc string) {
			if err := os.Symlink("../usr/share/zoneinfo/America/Chicago", filepath.Join(etc, "localtime")); err != nil {
				t.Fatal(err)
			}
		}, "America/Chicago"},
		{"TZif file", func(t *testing.T, etc string) {
			if err := os.WriteFile(filepath.Join(etc, "localtime"), tzif, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(etc, "timezone"), []byte("Asia/Kolkata\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}, "Asia/Kolkata"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			etc, zone := filepath.Join(root, "etc"), filepath.Join(root, "zone")
			for _, d := range []string{etc, zone} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			tc.etc(t, etc)
			host := map[string]string{mounts["host-etc"]: etc, mounts["host-zone"]: zone}
			if len(host) != 2 || mounts["host-etc"] == "" || mounts["host-zone"] == "" {
				t.Fatalf("host-zone init container mounts %v, want host-etc and host-zone", mounts)
			}
			args, _, _ := unstructured.NestedStringSlice(initC, "args")
			for i := range args {
				for in, at := range host {
					args[i] = strings.ReplaceAll(args[i], in, at)
				}
			}
			var out bytes.Buffer
			if err := dispatch(context.Background(), args, &out, &out); err != nil {
				t.Fatalf("host-zone %q: %v\n%s", args, err, out.String())
			}
			if !strings.Contains(out.String(), tc.want) {
				t.Errorf("the init container says %q, want the zone %s", out.String(), tc.want)
			}
			// The agent's config, its mount of the copy where the init
			// container wrote it.
			agentMount := ""
			c0, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
			avms, _, _ := unstructured.NestedSlice(c0[0].(map[string]any), "volumeMounts")
			for _, vm := range avms {
				if vm := vm.(map[string]any); vm["name"] == "host-zone" {
					agentMount = vm["mountPath"].(string)
				}
			}
			if agentMount == "" {
				t.Fatal("the agent does not mount the host-zone volume")
			}
			cfgPath := filepath.Join(root, "config.toml")
			if err := os.WriteFile(cfgPath, []byte(strings.ReplaceAll(conf, agentMount, zone)), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg, err := agent.LoadConfig("faultline-agent", []string{"--config", cfgPath}, func(string) string { return "gpu-node-0" })
			if err != nil {
				t.Fatal(err)
			}
			loc, err := hostzone.Location(cfg.TimeZone, cfg.TimeZoneFile)
			if err != nil || loc.String() != tc.want {
				t.Fatalf("the agent reads zone %s (%v) from time_zone_file %s, want %s", loc, err, cfg.TimeZoneFile, tc.want)
			}
		})
	}
}
