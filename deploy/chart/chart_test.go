package chart

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/faultline/faultline/agents/preflight/webhook"
	"github.com/faultline/faultline/agents/relay"
	"github.com/faultline/faultline/gateway"
	"github.com/faultline/faultline/internal/testenv"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

const release, namespace = "faultline", "faultline"

// render renders a value set (by name) with extra helm args.
func render(t *testing.T, set string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	helm := testenv.Helm(t)
	objs, err := Render(context.Background(), helm, t.TempDir(), release, namespace, []string{ValueSets()[set]}, args...)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// TestLint: helm lint --strict passes with each value set.
func TestLint(t *testing.T) {
	helm := testenv.Helm(t)
	for name, f := range ValueSets() {
		t.Run(name, func(t *testing.T) {
			out, err := Helm(context.Background(), helm, t.TempDir(), "lint", "--strict", Dir(), "-f", f)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
		})
	}
}

// TestSchemaRefusesTypos: a value the chart does not have, at the top, in
// a component or in the binaries' config sections, fails rendering with
// an error naming it; so does a missing required value.
func TestSchemaRefusesTypos(t *testing.T) {
	helm := testenv.Helm(t)
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{[]string{"kafka.brokerz=x"}, "at '/kafka': additional properties 'brokerz' not allowed"},
		{[]string{"gateway.replicaz=3"}, "at '/gateway': additional properties 'replicaz' not allowed"},
		{[]string{"config.store.batch_recrods=1"}, "at '/config/store': additional properties 'batch_recrods' not allowed"},
		{[]string{"config.kafka.brokers=x"}, "at '/config': additional properties 'kafka' not allowed"}, // the chart owns [kafka]
		{[]string{"agent.config.kmsg.pol_interval=1s"}, "at '/agent/config/kmsg': additional properties 'pol_interval' not allowed"},
		{[]string{"preflight.config.webhook.failure_polcy=Fail"}, "additional properties 'failure_polcy' not allowed"},
		{[]string{"agent.checks={nic,gpus}"}, "at '/agent/checks/1'"},
		{[]string{"agent.conformanceHostPaths={/etc/faultline,/sys/class}"}, "at '/agent/conformanceHostPaths/1'"},
		{[]string{"agent.conformanceHostPaths={/}"}, "at '/agent/conformanceHostPaths/0'"},
		{[]string{"config.store.batch_records=lots"}, "at '/config/store/batch_records': got string, want integer"},
		{[]string{"config.store.retention=3 days"}, "at '/config/store/retention'"},
		{[]string{"kafka.brokers="}, "kafka.brokers is required"},
		// A PDB of maxUnavailable 0 blocks every drain of a node running
		// a faultline pod; a DaemonSet's blocks its rolling update.
		{[]string{"defaults.pdb.maxUnavailable=0"}, "at '/defaults/pdb/maxUnavailable': minimum: got 0, want 1"},
		{[]string{"roles.store.overrides.pdb.maxUnavailable=0%"}, "at '/roles/store/overrides/pdb/maxUnavailable'"},
		{[]string{"agent.maxUnavailable=0%"}, "'0%' does not match pattern"},
	} {
		t.Run(tc.want, func(t *testing.T) { refused(t, helm, tc.set, tc.want) })
	}
}

// refused: the default set with set is refused, the error naming want.
func refused(t *testing.T, helm string, set []string, want string) {
	t.Helper()
	args := []string{"template", release, Dir(), "-n", namespace, "-f", ValueSets()["default"]}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	_, err := Helm(context.Background(), helm, t.TempDir(), args...)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("--set %v: error %v, want one naming %q", set, err, want)
	}
}

// TestComponents: the default set renders the gateway and the five roles
// as Deployments, each with an HPA and a PDB, the agent DaemonSet on GPU
// nodes, the preflight webhook, and least-privilege RBAC.
func TestComponents(t *testing.T) {
	objs := render(t, "default")
	for _, c := range []string{"gateway", "store", "correlate", "quarantine", "drain", "remediate", "conformance"} {
		name := "faultline-" + c
		for _, kind := range []string{"Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Service", "ServiceAccount", "NetworkPolicy"} {
			if Find(objs, kind, name) == nil {
				t.Errorf("no %s %s", kind, name)
			}
		}
		d := Find(objs, "Deployment", name)
		if d == nil {
			continue
		}
		args, _, _ := unstructured.NestedStringSlice(firstContainer(t, d), "args")
		if c == "gateway" && !slices.Equal(args, []string{"gateway", "--config", "/etc/faultline/config.toml"}) ||
			c != "gateway" && !slices.Contains(args, "--role="+c) {
			t.Errorf("%s args %q", name, args)
		}
		sc, _, _ := unstructured.NestedMap(d.Object, "spec", "template", "spec", "securityContext")
		if sc["runAsNonRoot"] != true || fmt.Sprint(sc["runAsUser"]) != "65532" {
			t.Errorf("%s pod securityContext %v", name, sc)
		}
	}
	if Find(objs, "Deployment", "faultline-janitor") != nil {
		t.Error("janitor is rendered though disabled by default")
	}
	ds := Find(objs, "DaemonSet", "faultline-agent")
	if ds == nil {
		t.Fatal("no agent DaemonSet")
	}
	sel, _, _ := unstructured.NestedStringMap(ds.Object, "spec", "template", "spec", "nodeSelector")
	if sel["nvidia.com/gpu.present"] != "true" {
		t.Errorf("agent nodeSelector %v", sel)
	}
	if Find(objs, "Deployment", "faultline-preflight") == nil || Find(objs, "Role", "faultline-preflight-webhook-tls") == nil {
		t.Error("no preflight webhook (Deployment, TLS Secret Role)")
	}
	// No local cluster in the default set: no role may touch this cluster.
	for _, o := range objs {
		if o.GetKind() == "ClusterRoleBinding" && !strings.HasPrefix(o.GetName(), "faultline-preflight") {
			t.Errorf("ClusterRoleBinding %s without kube.localCluster", o.GetName())
		}
	}
}

// TestAgentMounts: the DaemonSet mounts exactly what its enabled checks
// read and is privileged only to read /dev/kmsg. A non-root agent also
// mounts the copy of the system UUID its init container made.
func TestAgentMounts(t *testing.T) {
	for _, tc := range []struct {
		set        string
		args       []string
		mounts     []string
		privileged bool
		root       bool
	}{
		{"default", nil, []string{"/etc/faultline-agent", "/var/run/secrets/faultline", "/var/lib/faultline-agent", "/run/faultline-agent", "/host/sys", "/var/lib/nvsentinel", "/dev/kmsg", "/var/lib/kubelet/pod-resources"}, true, true},
		{"default", []string{"--set", "agent.checks={nic}", "--set", "agent.podResources=false"}, []string{"/etc/faultline-agent", "/var/run/secrets/faultline", "/var/lib/faultline-agent", "/run/faultline-agent", "/host/sys", "/var/lib/nvsentinel", "/var/run/faultline-machine"}, false, false},
		{"default", []string{"--set", "agent.checks={kmsg}", "--set", "agent.podResources=false"}, []string{"/etc/faultline-agent", "/var/run/secrets/faultline", "/var/lib/faultline-agent", "/run/faultline-agent", "/var/lib/nvsentinel", "/dev/kmsg"}, true, true},
		{"default", []string{"--set", "agent.checks={nic}"}, []string{"/etc/faultline-agent", "/var/run/secrets/faultline", "/var/lib/faultline-agent", "/run/faultline-agent", "/host/sys", "/var/lib/nvsentinel", "/var/lib/kubelet/pod-resources"}, false, true},
		{"cloud", nil, []string{"/etc/faultline-agent", "/var/run/secrets/faultline", "/var/lib/faultline-agent", "/run/faultline-agent", "/host/sys", "/var/lib/nvsentinel", "/host/var/log", "/host/proc", "/host/dev", "/var/log", "/usr/share/nvidia/nvswitch", "/var/run/nvidia-fabricmanager", "/etc/modprobe.d", "/var/run/faultline-zone", "/host/etc/faultline"}, false, true},
		{"default", []string{"--set", "agent.checks={conformance}", "--set", "agent.podResources=false"}, []string{"/etc/faultline-agent", "/var/run/secrets/faultline", "/var/lib/faultline-agent", "/run/faultline-agent", "/host/sys", "/host/proc", "/var/run/faultline-machine"}, false, false},
		{"default", []string{"--set", "agent.checks={csp}", "--set", "agent.podResources=false"}, []string{"/etc/faultline-agent", "/var/run/secrets/faultline", "/var/lib/faultline-agent", "/run/faultline-agent", "/var/run/faultline-machine"}, false, false},
		{"default", []string{"--set", "agent.checks={nic,conformance,csp}", "--set", "agent.podResources=false", "--set", "agent.conformanceHostPaths={/etc/faultline,/opt/image/hash}"}, []string{"/etc/faultline-agent", "/var/run/secrets/faultline", "/var/lib/faultline-agent", "/run/faultline-agent", "/host/sys", "/var/lib/nvsentinel", "/host/proc", "/var/run/faultline-machine", "/host/etc/faultline", "/host/opt/image/hash"}, false, false},
		// The host's zone (its /etc/localtime, time_zone = "host", copied by an init container) only for the logs printed in the host's local time: fabric's, a kmsg file.
		// A kmsg file's directory is mounted read-only at /host<dir>, read by root (in group adm): once nothing was mounted, and the check found no file and fell silent.
		{"default", []string{"--set", "agent.checks={kmsg}", "--set", "agent.podResources=false", "--set", "agent.config.kmsg.source=file", "--set", "agent.config.kmsg.file=/var/log/kern.log"}, []string{"/etc/faultline-agent", "/var/run/secrets/faultline", "/var/lib/faultline-agent", "/run/faultline-agent", "/var/lib/nvsentinel", "/host/var/log", "/var/run/faultline-zone"}, false, true},
		{"default", []string{"--set", "agent.checks={kmsg}", "--set", "agent.podResources=false", "--set", "agent.config.kmsg.source=journal"}, []string{"/etc/faultline-agent", "/var/run/secrets/faultline", "/var/lib/faultline-agent", "/run/faultline-agent", "/var/lib/nvsentinel", "/var/run/faultline-machine"}, false, false},
		{"cloud", []string{"--set", "agent.config.time_zone=America/Chicago"}, []string{"/etc/faultline-agent", "/var/run/secrets/faultline", "/var/lib/faultline-agent", "/run/faultline-agent", "/host/sys", "/var/lib/nvsentinel", "/host/var/log", "/host/proc", "/host/dev", "/var/log", "/usr/share/nvidia/nvswitch", "/var/run/nvidia-fabricmanager", "/etc/modprobe.d", "/host/etc/faultline"}, false, true},
		{"cloud", []string{"--set", "agent.conformanceHostPaths={/etc}"}, []string{"/etc/faultline-agent", "/var/run/secrets/faultline", "/var/lib/faultline-agent", "/run/faultline-agent", "/host/sys", "/var/lib/nvsentinel", "/host/var/log", "/host/proc", "/host/dev", "/var/log", "/usr/share/nvidia/nvswitch", "/var/run/nvidia-fabricmanager", "/etc/modprobe.d", "/var/run/faultline-zone", "/host/etc"}, false, true},
		// conformanceHostPaths are mounted only for the conformance check.
		{"default", []string{"--set", "agent.checks={nic}", "--set", "agent.podResources=false", "--set", "agent.conformanceHostPaths={/etc/faultline}"}, []string{"/etc/faultline-agent", "/var/run/secrets/faultline", "/var/lib/faultline-agent", "/run/faultline-agent", "/host/sys", "/var/lib/nvsentinel", "/var/run/faultline-machine"}, false, false},
	} {
		t.Run(tc.set+strings.Join(tc.args, ""), func(t *testing.T) {
			ds := Find(render(t, tc.set, tc.args...), "DaemonSet", "faultline-agent")
			if tc.set == "cloud" {
				ds = Find(render(t, tc.set, tc.args...), "DaemonSet", "fl-agent")
			}
			if ds == nil {
				t.Fatal("no agent DaemonSet")
			}
			c := firstContainer(t, ds)
			vms, _, _ := unstructured.NestedSlice(c, "volumeMounts")
			var got []string
			for _, vm := range vms {
				got = append(got, vm.(map[string]any)["mountPath"].(string))
			}
			if !slices.Equal(got, tc.mounts) {
				t.Errorf("mounts %q\nwant   %q", got, tc.mounts)
			}
			priv, _, _ := unstructured.NestedBool(c, "securityContext", "privileged")
			if priv != tc.privileged {
				t.Errorf("privileged %v, want %v", priv, tc.privileged)
			}
			uid, _, _ := unstructured.NestedFieldNoCopy(ds.Object, "spec", "template", "spec", "securityContext", "runAsUser")
			if (fmt.Sprint(uid) == "0") != tc.root {
				t.Errorf("runAsUser %v, want root %v", uid, tc.root)
			}
			// A non-root agent reads its token and the gateway's CA (mode
			// 0440) as their group: without fsGroup they were root's.
			fsGroup, _, _ := unstructured.NestedFieldNoCopy(ds.Object, "spec", "template", "spec", "securityContext", "fsGroup")
			if !tc.root && fmt.Sprint(fsGroup) != "65532" {
				t.Errorf("non-root agent: fsGroup %v, want 65532 (the token volume is 0440)", fsGroup)
			}
			// A non-root agent's state host path is given to it first; the
			// host's zone is copied for it where it reads it.
			var inits []string
			for _, c := range mustSlice(ds.Object, "spec", "template", "spec", "initContainers") {
				inits = append(inits, c.(map[string]any)["name"].(string))
			}
			if slices.Contains(inits, "state-owner") == tc.root {
				t.Errorf("init containers %q, want state-owner exactly when the agent is not root", inits)
			}
			if slices.Contains(inits, "host-zone") != slices.Contains(tc.mounts, "/var/run/faultline-zone") {
				t.Errorf("init containers %q, want host-zone exactly when the agent mounts its copy of the zone", inits)
			}
			if !tc.privileged {
				drop, _, _ := unstructured.NestedStringSlice(c, "securityContext", "capabilities", "drop")
				if !slices.Equal(drop, []string{"ALL"}) {
					t.Errorf("capabilities drop %q", drop)
				}
			}
		})
	}
}

// TestAgentHostTimeZone: where a check reads a log printed in the host's
// local time (fabric, a kmsg file), the host's /etc is mounted read-only
// (a Directory: a hostPath of /etc/localtime itself would make a directory
// there on a host without one, or fail the pod) into an init container
// alone, not root and with no capability, that copies the zone into a
// memory volume; the agent (root with fabric) mounts only that copy, and
// time_zone_file points at it. A zone named in agent.config.time_zone
// needs none of it.
func TestAgentHostTimeZone(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		mount bool
	}{
		{[]string{"--set", "agent.checks={fabric}"}, true},
		{[]string{"--set", "agent.checks={kmsg}", "--set", "agent.config.kmsg.source=file", "--set", "agent.config.kmsg.file=/var/log/kern.log"}, true},
		{[]string{"--set", "agent.checks={fabric}", "--set", "agent.config.time_zone=UTC"}, false},
		{[]string{"--set", "agent.checks={nic,kmsg}"}, false},
	} {
		objs := render(t, "default", tc.args...)
		ds := Find(objs, "DaemonSet", "faultline-agent")
		vols := map[string]map[string]any{}
		for _, v := range mustSlice(ds.Object, "spec", "template", "spec", "volumes") {
			v := v.(map[string]any)
			vols[v["name"].(string)] = v
		}
		conf, err := ConfigTOML(objs, "faultline-agent")
		if err != nil {
			t.Fatal(err)
		}
		hasFile := strings.Contains(conf, `time_zone_file = "/var/run/faultline-zone/localtime"`)
		if (vols["host-etc"] != nil) != tc.mount || (vols["host-zone"] != nil) != tc.mount || hasFile != tc.mount {
			t.Errorf("%q: host-etc volume %v, host-zone volume %v, time_zone_file set %v; want all %v:\n%s", tc.args, vols["host-etc"], vols["host-zone"], hasFile, tc.mount, conf)
			continue
		}
		if !tc.mount {
			continue
		}
		if p, _, _ := unstructured.NestedString(vols["host-etc"], "hostPath", "path"); p != "/etc" {
			t.Errorf("host-etc mounts %q", p)
		}
		if typ, _, _ := unstructured.NestedString(vols["host-etc"], "hostPath", "type"); typ != "Directory" {
			t.Errorf("host-etc hostPath type %q, want Directory (never created on the host)", typ)
		}
		if m, _, _ := unstructured.NestedString(vols["host-zone"], "emptyDir", "medium"); m != "Memory" {
			t.Errorf("host-zone volume %v, want an emptyDir in memory", vols["host-zone"])
		}
		// mounts lists the containers that mount volume name, with
		// readOnly, and checks their security context.
		mounts := func(name string) map[string]bool {
			got := map[string]bool{}
			for _, field := range []string{"initContainers", "containers"} {
				for _, c := range mustSlice(ds.Object, "spec", "template", "spec", field) {
					c := c.(map[string]any)
					for _, vm := range mustSlice(c, "volumeMounts") {
						if vm := vm.(map[string]any); vm["name"] == name {
							got[c["name"].(string)] = vm["readOnly"] == true
						}
					}
				}
			}
			return got
		}
		if got := mounts("host-etc"); !maps.Equal(got, map[string]bool{"host-zone": true}) {
			t.Errorf("host-etc mounted by (container: read-only) %v, want only the host-zone init container, read-only", got)
		}
		if got := mounts("host-zone"); !maps.Equal(got, map[string]bool{"host-zone": false, "agent": true}) {
			t.Errorf("host-zone mounted by %v, want the init container writing it and the agent reading it", got)
		}
		for _, c := range mustSlice(ds.Object, "spec", "template", "spec", "initContainers") {
			c := c.(map[string]any)
			if c["name"] != "host-zone" {
				continue
			}
			uid, _, _ := unstructured.NestedFieldNoCopy(c, "securityContext", "runAsUser")
			nonRoot, _, _ := unstructured.NestedBool(c, "securityContext", "runAsNonRoot")
			drop, _, _ := unstructured.NestedStringSlice(c, "securityContext", "capabilities", "drop")
			if fmt.Sprint(uid) == "0" || !nonRoot || !slices.Equal(drop, []string{"ALL"}) {
				t.Errorf("host-zone init container runs as %v (runAsNonRoot %v), drops %q: it must not read the host's secrets", uid, nonRoot, drop)
			}
		}
	}
}

func mustSlice(obj map[string]any, fields ...string) []any {
	s, _, _ := unstructured.NestedSlice(obj, fields...)
	return s
}

// TestAgentConformanceAndCSP: with agent.checks [nic, conformance, csp]
// the conformance check reads the host's /sys and /proc through read-only
// mounts its config points at, and its host paths read-only at
// /host<path>; bmc_command is empty (no ipmitool in the image) unless the
// user sets it; csp asks the node's metadata server over the host network.
// TestChartConfigLoads (cmd/faultline) loads the rendered config with the
// agent's loader.
func TestAgentConformanceAndCSP(t *testing.T) {
	objs := render(t, "default", "--set", "agent.checks={nic,conformance,csp}", "--set", "agent.conformanceHostPaths={/etc/faultline}")
	ds := Find(objs, "DaemonSet", "faultline-agent")
	if ds == nil {
		t.Fatal("no agent DaemonSet")
	}
	if hn, _, _ := unstructured.NestedBool(ds.Object, "spec", "template", "spec", "hostNetwork"); !hn {
		t.Error("csp: not on the host network (the node's metadata server)")
	}
	vms, _, _ := unstructured.NestedSlice(firstContainer(t, ds), "volumeMounts")
	mounts := map[string]map[string]any{}
	for _, vm := range vms {
		m := vm.(map[string]any)
		mounts[m["mountPath"].(string)] = m
	}
	vols, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "volumes")
	hostPaths := map[string]string{}
	for _, v := range vols {
		v := v.(map[string]any)
		if p, ok, _ := unstructured.NestedString(v, "hostPath", "path"); ok {
			hostPaths[v["name"].(string)] = p
		}
	}
	for mountPath, host := range map[string]string{"/host/sys": "/sys", "/host/proc": "/proc", "/host/etc/faultline": "/etc/faultline"} {
		m := mounts[mountPath]
		switch {
		case m == nil:
			t.Errorf("no mount at %s", mountPath)
		case m["readOnly"] != true:
			t.Errorf("%s is not read-only", mountPath)
		case hostPaths[m["name"].(string)] != host:
			t.Errorf("%s mounts host path %q, want %q", mountPath, hostPaths[m["name"].(string)], host)
		}
	}
	conf, err := ConfigTOML(objs, "faultline-agent")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`checks = ["nic", "conformance", "csp"]`, "[conformance]\nbmc_command = []\nprocfs = \"/host/proc\"\nsysfs = \"/host/sys\"\n"} {
		if !strings.Contains(conf, want) {
			t.Errorf("agent config.toml lacks %q:\n%s", want, conf)
		}
	}
	// The user's bmc_command is kept.
	objs = render(t, "default", "--set", "agent.checks={conformance}", "--set", "agent.config.conformance.bmc_command={ipmitool,mc,info}")
	if conf, err = ConfigTOML(objs, "faultline-agent"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(conf, `bmc_command = ["ipmitool", "mc", "info"]`) {
		t.Errorf("agent.config.conformance.bmc_command was not kept:\n%s", conf)
	}
}

// TestRBACMatchesDeployRBAC: each role's ClusterRole in the chart has the
// rules of its deploy/rbac/*.yaml (the verbs its code uses), no more (but
// the value set's rbac.extraRules, after them).
func TestRBACMatchesDeployRBAC(t *testing.T) {
	objs := render(t, "secure")
	for _, tc := range []struct {
		file, chartName, refName string
		extra                    int // rules the secure set adds (rbac.extraRules)
	}{
		{"drain.yaml", "faultline-drain", "faultline-drain", 0},
		{"quarantine.yaml", "faultline-quarantine", "faultline-quarantine", 0},
		{"remediate.yaml", "faultline-remediate", "faultline-remediate", 0},
		{"conformance.yaml", "faultline-conformance", "faultline-conformance", 0},
		{"janitor.yaml", "faultline-janitor", "faultline-janitor", 1},
		{"preflight.yaml", "faultline-preflight-webhook", "faultline-preflight-webhook", 0},
		{"preflight.yaml", "faultline-preflight-check", "faultline-preflight-check", 0},
	} {
		ref := deployRBAC(t, tc.file)
		want := Find(ref, "ClusterRole", tc.refName)
		got := Find(objs, "ClusterRole", tc.chartName)
		if want == nil || got == nil {
			t.Errorf("%s: ClusterRole missing (deploy/rbac %v, chart %v)", tc.chartName, want != nil, got != nil)
			continue
		}
		wr, _, _ := unstructured.NestedSlice(want.Object, "rules")
		gr, _, _ := unstructured.NestedSlice(got.Object, "rules")
		gr = gr[:max(0, len(gr)-tc.extra)]
		if w, g := rulesYAML(t, wr), rulesYAML(t, gr); w != g {
			t.Errorf("%s rules differ from deploy/rbac/%s:\nchart:\n%s\ndeploy/rbac:\n%s", tc.chartName, tc.file, g, w)
		}
	}
	// Store, correlate and the gateway never call the Kubernetes API.
	for _, c := range []string{"gateway", "store", "correlate"} {
		if Find(objs, "ClusterRole", "faultline-"+c) != nil {
			t.Errorf("%s has a ClusterRole", c)
		}
		d := Find(objs, "Deployment", "faultline-"+c)
		if auto, _, _ := unstructured.NestedBool(d.Object, "spec", "template", "spec", "automountServiceAccountToken"); auto {
			t.Errorf("%s mounts a service account token", c)
		}
	}
	// The janitor reads the BMC credential Secrets in their namespace only.
	if r := Find(objs, "Role", "faultline-janitor-bmc-credentials"); r == nil || r.GetNamespace() != "faultline" {
		t.Errorf("janitor's Secret Role: %v", r)
	}
	// It creates node Events in their namespace only, as deploy/rbac says.
	ref := deployRBAC(t, "janitor.yaml")
	want, got := Find(ref, "Role", "faultline-janitor-node-events"), Find(objs, "Role", "faultline-janitor-node-events")
	if want == nil || got == nil || got.GetNamespace() != "default" {
		t.Errorf("janitor's node Events Role: chart %v, deploy/rbac %v", got, want)
	} else {
		wr, _, _ := unstructured.NestedSlice(want.Object, "rules")
		gr, _, _ := unstructured.NestedSlice(got.Object, "rules")
		if w, g := rulesYAML(t, wr), rulesYAML(t, gr); w != g {
			t.Errorf("janitor's node Events rules differ from deploy/rbac:\nchart:\n%s\ndeploy/rbac:\n%s", g, w)
		}
	}
	// quarantine's namespaced rights are where its config says.
	if r := Find(objs, "Role", "faultline-quarantine"); r == nil || (r.GetNamespace() != "faultline-events" && r.GetNamespace() != "faultline") {
		t.Errorf("quarantine Role: %v", r)
	}
}

// deployRBAC is the objects of deploy/rbac/<file>.
func deployRBAC(t *testing.T, file string) []*unstructured.Unstructured {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "rbac", file))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func rulesYAML(t *testing.T, rules []any) string {
	t.Helper()
	b, err := yaml.Marshal(rules)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func firstContainer(t *testing.T, o *unstructured.Unstructured) map[string]any {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	if len(cs) == 0 {
		t.Fatalf("%s %s has no containers", o.GetKind(), o.GetName())
	}
	return cs[0].(map[string]any)
}

// TestCRDsAreDeployCRDs: the chart's crds/ are deploy/crds.
func TestCRDsAreDeployCRDs(t *testing.T) {
	ref, _ := filepath.Glob(filepath.Join("..", "crds", "*.yaml"))
	got, _ := filepath.Glob(filepath.Join(Dir(), "crds", "*.yaml"))
	if len(ref) == 0 || len(ref) != len(got) {
		t.Fatalf("deploy/crds has %d files, the chart's crds/ %d", len(ref), len(got))
	}
	for _, f := range ref {
		a, _ := os.ReadFile(f)
		b, err := os.ReadFile(filepath.Join(Dir(), "crds", filepath.Base(f)))
		if err != nil || string(a) != string(b) {
			t.Errorf("crds/%s differs from deploy/crds (copy it: cp deploy/crds/*.yaml deploy/chart/faultline/crds/)", filepath.Base(f))
		}
	}
}

// TestOverrides: a component's overrides lay over defaults, false and 0
// included; defaults apply to every component.
func TestOverrides(t *testing.T) {
	objs := render(t, "default", "--set", "gateway.overrides.autoscaling.enabled=false", "--set", "gateway.overrides.replicas=3",
		"--set", "roles.store.overrides.pdb.enabled=false")
	if Find(objs, "HorizontalPodAutoscaler", "faultline-gateway") != nil {
		t.Error("gateway HPA rendered though its override turns autoscaling off")
	}
	if r, _, _ := unstructured.NestedFieldNoCopy(Find(objs, "Deployment", "faultline-gateway").Object, "spec", "replicas"); fmt.Sprint(r) != "3" {
		t.Errorf("gateway replicas %v, want 3", r)
	}
	if Find(objs, "HorizontalPodAutoscaler", "faultline-store") == nil || Find(objs, "PodDisruptionBudget", "faultline-store") != nil {
		t.Error("store: want an HPA and no PDB")
	}
	digest := "sha256:" + strings.Repeat("ab", 32)
	pinned := render(t, "default", "--set", "image.digests.faultline-agent="+digest, "--set", "image.tag=v1.2.3")
	if img := firstContainer(t, Find(pinned, "DaemonSet", "faultline-agent"))["image"]; img != "ghcr.io/faultline/faultline-agent@"+digest {
		t.Errorf("pinned agent image %v", img)
	}
	if img := firstContainer(t, Find(pinned, "Deployment", "faultline-gateway"))["image"]; img != "ghcr.io/faultline/faultline:v1.2.3" {
		t.Errorf("gateway image %v", img)
	}
	cloud := render(t, "cloud")
	for _, o := range cloud {
		if o.GetKind() == "HorizontalPodAutoscaler" || o.GetKind() == "PodDisruptionBudget" || o.GetKind() == "NetworkPolicy" {
			t.Errorf("cloud set: %s %s rendered", o.GetKind(), o.GetName())
		}
	}
	if r, _, _ := unstructured.NestedFieldNoCopy(Find(cloud, "Deployment", "fl-store").Object, "spec", "replicas"); fmt.Sprint(r) != "1" {
		t.Errorf("cloud store replicas %v, want 1", r)
	}
	sec := render(t, "secure")
	if m, _, _ := unstructured.NestedFieldNoCopy(Find(sec, "HorizontalPodAutoscaler", "faultline-gateway").Object, "spec", "minReplicas"); fmt.Sprint(m) != "3" {
		t.Errorf("secure gateway HPA minReplicas %v, want 3", m)
	}
	for _, name := range []string{"faultline-conformance", "faultline-janitor"} {
		if Find(sec, "Deployment", name) == nil {
			t.Errorf("secure set: no Deployment %s", name)
		}
	}
	// Its BMC Secrets in the release namespace (its replicas:
	// TestJanitorNeverTwo).
	if conf, _, _ := unstructured.NestedString(Find(sec, "ConfigMap", "faultline-config").Object, "data", "config.toml"); !strings.Contains(conf, `secret_namespace = "`+namespace+`"`) {
		t.Errorf("janitor.redfish.secret_namespace not the release namespace:\n%s", conf)
	}
}

// TestLocalActionsSigned: with agent.localActions the agents serve the
// local action endpoint on the node's address, holding only the janitor's
// public key (a ConfigMap) and keeping their record in the state host
// path; the janitor's private key is mounted in the janitor's pod alone
// and named by a flag. No bearer token is shared by the nodes, and a
// private key given as the agents' key, or no key, fails the install.
func TestLocalActionsSigned(t *testing.T) {
	sec := render(t, "secure")
	ds := Find(sec, "DaemonSet", "faultline-agent")
	c := firstContainer(t, ds)
	args, _, _ := unstructured.NestedStringSlice(c, "args")
	if !slices.Contains(args, "--local-actions.listen=[$(HOST_IP)]:9477") {
		t.Errorf("agent args %q", args)
	}
	conf, err := ConfigTOML(sec, "faultline-agent")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(conf, `verify_key_file = "/etc/faultline-agent-local-actions/verify.pub"`) ||
		!strings.Contains(conf, `state_file = "/var/lib/faultline-agent/local-actions.json"`) || strings.Contains(conf, "token_file = \"/etc") {
		t.Errorf("agent local_actions config:\n%s", conf)
	}
	pub, _, _ := unstructured.NestedString(Find(sec, "ConfigMap", "faultline-agent-local-actions").Object, "data", "local-actions.pub")
	if !strings.HasPrefix(pub, "-----BEGIN PUBLIC KEY-----") {
		t.Errorf("verify key ConfigMap %q", pub)
	}
	vols, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "volumes")
	for _, v := range vols {
		if strings.Contains(fmt.Sprint(v), "faultline-janitor-local-actions") {
			t.Errorf("the agents mount the janitor's private key: %v", v)
		}
	}
	j := Find(sec, "Deployment", "faultline-janitor")
	jargs, _, _ := unstructured.NestedStringSlice(firstContainer(t, j), "args")
	if !slices.Contains(jargs, "--janitor.local.signing-key-file=/var/run/secrets/faultline/janitor/local-actions.key") {
		t.Errorf("janitor args %q", jargs)
	}
	jvols, _, _ := unstructured.NestedSlice(j.Object, "spec", "template", "spec", "volumes")
	if !strings.Contains(fmt.Sprint(jvols), "name:faultline-janitor-local-actions") || !strings.Contains(fmt.Sprint(jvols), "path:janitor/local-actions.key") {
		t.Errorf("janitor volumes %v", jvols)
	}
	for _, name := range []string{"faultline-store", "faultline-gateway"} {
		vols, _, _ := unstructured.NestedSlice(Find(sec, "Deployment", name).Object, "spec", "template", "spec", "volumes")
		if strings.Contains(fmt.Sprint(vols), "local-actions") {
			t.Errorf("%s mounts the janitor's key: %v", name, vols)
		}
	}
	if def := render(t, "default"); strings.Contains(fmt.Sprint(firstContainer(t, Find(def, "DaemonSet", "faultline-agent"))["args"]), "local-actions") {
		t.Error("the default set serves local actions")
	}
	helm := testenv.Helm(t)
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{[]string{"agent.localActions.enabled=true"}, "agent.localActions.verifyKey (the janitor's Ed25519 public key, PEM) or agent.localActions.verifyKeyConfigMap is required"},
		{[]string{"agent.localActions.enabled=true", "agent.localActions.verifyKey=-----BEGIN PRIVATE KEY-----"}, "agent.localActions.verifyKey holds a PRIVATE KEY"},
		{[]string{"agent.config.local_actions.token_file=/etc/token"}, "at '/agent/config/local_actions': additional properties 'token_file' not allowed"},
		{[]string{"config.janitor.local.token_file=/etc/token"}, "at '/config/janitor/local': additional properties 'token_file' not allowed"},
	} {
		t.Run(tc.want, func(t *testing.T) { refused(t, helm, tc.set, tc.want) })
	}
}

// TestAgentOnly: an agent-only install on a member cluster (no gateway,
// roles or webhook; no Kafka or ClickHouse values) renders the agent
// alone, sending with TLS to the gateway elsewhere, verified by its CA.
func TestAgentOnly(t *testing.T) {
	helm := testenv.Helm(t)
	args := []string{"template", "member", Dir(), "-n", "faultline"}
	for _, s := range []string{"gateway.enabled=false", "roles.store.enabled=false", "roles.correlate.enabled=false",
		"roles.quarantine.enabled=false", "roles.drain.enabled=false", "roles.remediate.enabled=false",
		"roles.conformance.enabled=false", "preflight.enabled=false", "agent.gatewayAddr=gw.fleet.example:443",
		"agent.tokenSecret=agent-token", "agent.gatewayCASecret.name=fleet-ca"} {
		args = append(args, "--set", s)
	}
	out, err := Helm(context.Background(), helm, t.TempDir(), args...)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, o.GetKind()+"/"+o.GetName())
	}
	slices.Sort(kinds)
	if want := []string{"ConfigMap/member-faultline-agent", "DaemonSet/member-faultline-agent", "ServiceAccount/member-faultline-agent"}; !slices.Equal(kinds, want) {
		t.Errorf("objects %q, want %q", kinds, want)
	}
	conf, err := ConfigTOML(objs, "member-faultline-agent")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(conf, `addr = "gw.fleet.example:443"`) || !strings.Contains(conf, `ca_file = "/var/run/secrets/faultline/gateway-ca.crt"`) || strings.Contains(conf, "insecure") {
		t.Errorf("agent gateway config:\n%s", conf)
	}
}

// TestValuesChangeRollsPods: a values change that a component reads only
// at start — its config, its rule file — changes that component's pod
// template (a checksum annotation), so helm upgrade rolls it; without, the
// ConfigMap changes and the running pods keep the old rules until
// something restarts them. A change another component does not read
// leaves its pods alone. The gateway's tokens change no pod template: the
// gateway follows its tokens file (gateway TestTokensFileFollowed), and a
// hash of a weak token in the Deployment could be brute-forced by anyone
// who may read it.
func TestValuesChangeRollsPods(t *testing.T) {
	base := []string{"--set", "roles.quarantine.rules=# rules v1", "--set", "roles.correlate.rules=# rules v1"}
	templates := func(set ...string) map[string]string {
		out := map[string]string{}
		args := slices.Clone(base)
		for _, s := range set {
			args = append(args, "--set", s)
		}
		for _, o := range render(t, "default", args...) {
			if o.GetKind() == "Deployment" || o.GetKind() == "DaemonSet" {
				a, _, _ := unstructured.NestedStringMap(o.Object, "spec", "template", "metadata", "annotations")
				out[o.GetName()] = fmt.Sprint(a)
			}
		}
		return out
	}
	before := templates()
	for _, tc := range []struct {
		name  string
		set   []string
		rolls []string
	}{
		{"quarantine rules", []string{"roles.quarantine.rules=# rules v2"}, []string{"faultline-quarantine"}},
		{"correlate rules", []string{"roles.correlate.rules=# rules v2"}, []string{"faultline-correlate"}},
		{"a gateway token added", []string{"gateway.tokens.items[0].token=agent-token-0123456789abcdef", "gateway.tokens.items[0].cluster=gpu-east",
			"gateway.tokens.items[0].role=agent", "gateway.tokens.items[1].token=agent-token-fedcba9876543210", "gateway.tokens.items[1].cluster=gpu-west"},
			nil},
		{"config", []string{"config.store.batch_records=7"}, []string{"faultline-gateway", "faultline-store", "faultline-correlate",
			"faultline-quarantine", "faultline-drain", "faultline-remediate", "faultline-conformance"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			after := templates(tc.set...)
			for name, a := range before {
				if rolled := after[name] != a; rolled != slices.Contains(tc.rolls, name) {
					t.Errorf("%s: pod template changed %v, want %v (annotations before %s, after %s)", name, rolled, !rolled, a, after[name])
				}
			}
		})
	}
}

// TestGoMemLimitUnderMemoryLimit: every faultline container with a memory
// limit runs with GOMEMLIMIT at 90% of it, so the Go runtime collects
// before the kernel kills the pod: without, the heap grows to twice what is
// live before a collection, and a role holding half its limit —
// correlate's remembered records (up to 256 MiB) under the default 512Mi,
// quarantine's node watch of many clusters — is OOMKilled. A GOMEMLIMIT of
// the operator's own is kept, and a container without a limit gets none.
func TestGoMemLimitUnderMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  string
		args []string
		want map[string]string // container's workload → GOMEMLIMIT ("": none); others: 90% of the limit
	}{
		{"default", "default", nil, map[string]string{"faultline-store": "966367641", "faultline-agent": "120795955", "faultline-preflight": "241591910"}},
		{"secure", "secure", nil, nil},
		{"cloud", "cloud", nil, nil},
		{"a role's own limit", "default", []string{"--set", "roles.correlate.overrides.resources.limits.memory=2Gi"},
			map[string]string{"faultline-correlate": "1932735283", "faultline-store": "966367641"}},
		{"the operator's GOMEMLIMIT", "default", []string{"--set", "roles.store.overrides.env[0].name=GOMEMLIMIT", "--set", "roles.store.overrides.env[0].value=300MiB"},
			map[string]string{"faultline-store": "300MiB"}},
		{"no limit", "default", []string{"--set", "defaults.resources.limits=null"}, map[string]string{"faultline-store": "966367641", "faultline-gateway": ""}}, // the store keeps its own 1Gi
	} {
		t.Run(tc.name, func(t *testing.T) {
			checked := 0
			for _, o := range render(t, tc.set, tc.args...) {
				if o.GetKind() != "Deployment" && o.GetKind() != "DaemonSet" {
					continue
				}
				c := firstContainer(t, o)
				var got []string
				env, _, _ := unstructured.NestedSlice(c, "env")
				for _, e := range env {
					if e := e.(map[string]any); e["name"] == "GOMEMLIMIT" {
						got = append(got, fmt.Sprint(e["value"]))
					}
				}
				want, ok := tc.want[o.GetName()]
				if !ok {
					limit, _, _ := unstructured.NestedString(c, "resources", "limits", "memory")
					if limit == "" {
						continue
					}
					q, err := resource.ParseQuantity(limit)
					if err != nil {
						t.Fatalf("%s: limit %q: %v", o.GetName(), limit, err)
					}
					want = fmt.Sprint(q.Value() * 9 / 10)
				}
				checked++
				if want == "" && len(got) != 0 || want != "" && !slices.Equal(got, []string{want}) {
					t.Errorf("%s: GOMEMLIMIT %q, want %q", o.GetName(), got, want)
				}
			}
			if checked == 0 {
				t.Fatal("no container checked")
			}
		})
	}
}

// TestJanitorMaintenanceState: with config.janitor.aws.maintenance_regions
// the chart grants the maintenance monitor's state ConfigMap in the
// Lease's namespace, with deploy/rbac/janitor.yaml's rules; without, no
// such Role.
func TestJanitorMaintenanceState(t *testing.T) {
	const name = "faultline-janitor-maintenance"
	if Find(render(t, "secure"), "Role", name) != nil {
		t.Error("a maintenance state Role without aws.maintenance_regions")
	}
	objs := render(t, "secure", "--set", "config.janitor.aws.maintenance_regions={us-east-1}", "--set", "config.janitor.aws.maintenance_cluster=local")
	got, ref := Find(objs, "Role", name), Find(deployRBAC(t, "janitor.yaml"), "Role", name)
	if got == nil || ref == nil || got.GetNamespace() != namespace {
		t.Fatalf("maintenance state Role: chart %v, deploy/rbac %v; want one in the release namespace", got, ref)
	}
	wr, _, _ := unstructured.NestedSlice(ref.Object, "rules")
	gr, _, _ := unstructured.NestedSlice(got.Object, "rules")
	if w, g := rulesYAML(t, wr), rulesYAML(t, gr); w != g {
		t.Errorf("maintenance state rules differ from deploy/rbac:\nchart:\n%s\ndeploy/rbac:\n%s", g, w)
	}
	if b := Find(objs, "RoleBinding", name); b == nil || b.GetNamespace() != namespace {
		t.Errorf("maintenance state RoleBinding: %v", b)
	}
}

// TestJanitorNeverTwo: the janitor counts its concurrency limits
// (max_concurrent, _per_rack, _per_provider) in its process, from the
// operations it started and those in progress when it started; a second
// janitor working beside it counts its own. A rolling update (a new image,
// a config change) once ran the new janitor beside the old one until the
// new was ready and the old stopped: both started operations meanwhile,
// and a rack limit of 1 let two of a rack's nodes reboot at once.
//   - With leader election (the default), only the holder of a cluster's
//     Lease works it (processors/janitor TestLeaderElection): two replicas,
//     rolled as the other components, with the Lease's rights in the
//     release namespace, as deploy/rbac/janitor.yaml grants them.
//   - Without it, one replica, replaced (Recreate), never surged.
func TestJanitorNeverTwo(t *testing.T) {
	ref := deployRBAC(t, "janitor.yaml")
	for _, tc := range []struct {
		name     string
		args     []string
		strategy string
		replicas string
		lease    bool
	}{
		{"secure", nil, "", "2", true},
		{"with overrides", []string{"--set", "roles.janitor.overrides.resources.limits.memory=1Gi"}, "", "2", true},
		{"without leader election", []string{"--set", "config.janitor.leader_election=false"}, "Recreate", "1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, "secure", tc.args...)
			for _, o := range objs {
				if o.GetKind() != "Deployment" {
					continue
				}
				strategy, _, _ := unstructured.NestedString(o.Object, "spec", "strategy", "type")
				switch {
				case o.GetName() == "faultline-janitor":
					replicas, _, _ := unstructured.NestedFieldNoCopy(o.Object, "spec", "replicas")
					if strategy != tc.strategy || fmt.Sprint(replicas) != tc.replicas {
						t.Errorf("janitor: strategy %q, %v replicas; want %q, %s", strategy, replicas, tc.strategy, tc.replicas)
					}
				case strategy != "":
					t.Errorf("%s: strategy %q, want the default rolling update", o.GetName(), strategy)
				}
			}
			if Find(objs, "HorizontalPodAutoscaler", "faultline-janitor") != nil {
				t.Error("janitor: an HPA (one janitor works a cluster at a time)")
			}
			got := Find(objs, "Role", "faultline-janitor-lease")
			switch {
			case !tc.lease && got != nil:
				t.Error("a Lease Role without leader election")
			case tc.lease && (got == nil || got.GetNamespace() != namespace):
				t.Errorf("janitor's Lease Role: %v, want one in the release namespace", got)
			case tc.lease:
				wr, _, _ := unstructured.NestedSlice(Find(ref, "Role", "faultline-janitor-lease").Object, "rules")
				gr, _, _ := unstructured.NestedSlice(got.Object, "rules")
				if w, g := rulesYAML(t, wr), rulesYAML(t, gr); w != g {
					t.Errorf("janitor's Lease rules differ from deploy/rbac:\nchart:\n%s\ndeploy/rbac:\n%s", g, w)
				}
			}
			conf, _, _ := unstructured.NestedString(Find(objs, "ConfigMap", "faultline-config").Object, "data", "config.toml")
			if tc.lease && !strings.Contains(conf, `lease_namespace = "`+namespace+`"`) {
				t.Errorf("janitor.lease_namespace not the release namespace:\n%s", conf)
			}
		})
	}
}

// TestGatewayProbeScheme: with a certificate (gateway.tls.secretName) the
// gateway serves its HTTP port with TLS only, so the kubelet probes it
// over HTTPS (it does not verify the certificate, and the gateway asks for
// no client certificate it must have); over plain HTTP the probes got 400s,
// the gateway was never Ready and was restarted every few minutes. Without
// a certificate the probes are plain HTTP, as are the roles'.
func TestGatewayProbeScheme(t *testing.T) {
	for _, tc := range []struct {
		set, want string
	}{
		{"secure", "HTTPS"},
		{"default", ""},
	} {
		objs := render(t, tc.set)
		for _, o := range objs {
			if o.GetKind() != "Deployment" || !strings.HasPrefix(o.GetName(), "faultline-") || o.GetName() == "faultline-preflight" {
				continue
			}
			want := ""
			if o.GetName() == "faultline-gateway" {
				want = tc.want
			}
			c := firstContainer(t, o)
			for _, probe := range []string{"readinessProbe", "livenessProbe"} {
				if got, _, _ := unstructured.NestedString(c, probe, "httpGet", "scheme"); got != want {
					t.Errorf("%s: %s %s scheme %q, want %q", tc.set, o.GetName(), probe, got, want)
				}
			}
		}
	}
}

// TestGatewayTokensParse: the tokens file the chart writes from
// gateway.tokens.items is one the gateway reads, each item as it says: an
// item with a node and no role keeps its empty role field
// (token,cluster,,node), where it was once dropped and the node read as
// the role, so the gateway refused the whole file.
func TestGatewayTokensParse(t *testing.T) {
	values := filepath.Join(t.TempDir(), "tokens.yaml")
	if err := os.WriteFile(values, []byte(`gateway:
  tokens:
    items:
      - {token: agent-token-0123456789abcdef, cluster: gpu-east}
      - {token: node-token-0123456789abcdef, cluster: gpu-east, node: gpu-node-7}
      - {token: node-token-fedcba9876543210, cluster: gpu-west, role: agent, node: gpu-node-8}
      - {token: oper-token-0123456789abcdef, cluster: gpu-west, role: operator}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	s := Find(render(t, "default", "-f", values), "Secret", "faultline-gateway-tokens")
	if s == nil {
		t.Fatal("no gateway tokens Secret")
	}
	file, _, _ := unstructured.NestedString(s.Object, "stringData", "tokens")
	tokens, err := gateway.ParseTokens(strings.NewReader(file))
	if err != nil {
		t.Fatalf("the gateway refuses the tokens file: %v\n%s", err, file)
	}
	for _, want := range []struct {
		token, cluster, node string
		role                 datamodels.SubmitterRole
	}{
		{"agent-token-0123456789abcdef", "gpu-east", "", gateway.RoleAgent},
		{"node-token-0123456789abcdef", "gpu-east", "gpu-node-7", gateway.RoleAgent},
		{"node-token-fedcba9876543210", "gpu-west", "gpu-node-8", gateway.RoleAgent},
		{"oper-token-0123456789abcdef", "gpu-west", "", gateway.RoleOperator},
	} {
		c, ok := tokens.Lookup(want.token)
		if !ok || c.Cluster != want.cluster || c.Role != want.role || c.Node != want.node {
			t.Errorf("%s: caller %+v (found %v), want cluster %s role %s node %q\n%s", want.token, c, ok, want.cluster, want.role, want.node, file)
		}
	}
}

// TestAgentListenAddrIPv6: the agent listens (metrics, local actions) on
// the node's address, status.hostIP; on an IPv6-primary node that is
// fd00::1, and "fd00::1:2112" is no address (net.Listen: too many colons),
// so the agent exited at start and crash-looped. The address is bracketed,
// which an IPv4 one takes as well.
func TestAgentListenAddrIPv6(t *testing.T) {
	args, _, _ := unstructured.NestedStringSlice(firstContainer(t, Find(render(t, "secure"), "DaemonSet", "faultline-agent")), "args")
	checked := 0
	for _, a := range args {
		flag, addr, ok := strings.Cut(a, "=")
		if !ok || !strings.Contains(addr, "$(HOST_IP)") {
			continue
		}
		checked++
		for _, ip := range []string{"fd00::1", "10.0.0.1"} {
			host, _, err := net.SplitHostPort(strings.ReplaceAll(addr, "$(HOST_IP)", ip))
			if err != nil || host != ip {
				t.Errorf("%s with HOST_IP %s: host %q, %v", flag, ip, host, err)
			}
		}
	}
	if checked != 2 {
		t.Errorf("%d arguments name $(HOST_IP), want 2 (--metrics-addr, --local-actions.listen): %q", checked, args)
	}
	// Both forms listen.
	for _, addr := range []string{"[127.0.0.1]:0", "[::1]:0"} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			if addr == "[::1]:0" {
				t.Logf("no IPv6 loopback here: %v", err)
				continue
			}
			t.Fatalf("listen %s: %v", addr, err)
		}
		ln.Close()
	}
}

// TestAgentKmsgFile: with agent.config.kmsg.source file, the file's host
// directory is mounted read-only at /host<dir>, the config names the file
// there, and the agent reads it as root in group adm (a syslog kern.log
// is syslog:adm 0640). Once nothing was mounted: the check found no file,
// said so once at Info and reported no Xid again. A file that is not an
// absolute path is refused.
func TestAgentKmsgFile(t *testing.T) {
	objs := render(t, "default", "--set", "agent.checks={kmsg}", "--set", "agent.podResources=false",
		"--set", "agent.config.kmsg.source=file", "--set", "agent.config.kmsg.file=/var/log/kern.log")
	ds := Find(objs, "DaemonSet", "faultline-agent")
	conf, err := ConfigTOML(objs, "faultline-agent")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(conf, `file = "/host/var/log/kern.log"`) {
		t.Errorf("agent config.toml does not name the mounted file:\n%s", conf)
	}
	var mount map[string]any
	for _, vm := range mustSlice(firstContainer(t, ds), "volumeMounts") {
		if vm := vm.(map[string]any); vm["mountPath"] == "/host/var/log" {
			mount = vm
		}
	}
	if mount == nil || mount["readOnly"] != true {
		t.Fatalf("kmsg file's directory mount %v, want /host/var/log read-only", mount)
	}
	for _, v := range mustSlice(ds.Object, "spec", "template", "spec", "volumes") {
		if v := v.(map[string]any); v["name"] == mount["name"] {
			if p, _, _ := unstructured.NestedString(v, "hostPath", "path"); p != "/var/log" {
				t.Errorf("volume %v, want hostPath /var/log", v)
			}
		}
	}
	sc, _, _ := unstructured.NestedMap(ds.Object, "spec", "template", "spec", "securityContext")
	if fmt.Sprint(sc["runAsUser"]) != "0" || fmt.Sprint(sc["supplementalGroups"]) != "[4 64500]" {
		t.Errorf("pod securityContext %v, want root in group adm (4) and the relay socket's (64500)", sc)
	}
	helm := testenv.Helm(t)
	refused(t, helm, []string{"agent.checks={kmsg}", "agent.config.kmsg.source=file", "agent.config.kmsg.file=kern.log"}, "must be an absolute path")
	refused(t, helm, []string{"agent.checks={kmsg}", "agent.config.kmsg.source=file"}, "agent.config.kmsg.file is required")
}

// TestPreflightConfigurationOwned: the webhook creates its
// MutatingWebhookConfiguration owned by its ClusterRole, which the release
// owns (webhook.owner_cluster_role, preflight/webhook
// TestConfigurationOwnedByClusterRole), and may read that ClusterRole for
// its UID: helm uninstall, or preflight.enabled false, deletes the
// ClusterRole and so the configuration. Once nothing deleted it: it called
// a Service gone and, failing closed, refused every pod of the opted-in
// namespaces. With rbac.create false the operator names their own.
func TestPreflightConfigurationOwned(t *testing.T) {
	objs := render(t, "default")
	conf, err := ConfigTOML(objs, "faultline-preflight")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(conf, `owner_cluster_role = "faultline-preflight-webhook"`) {
		t.Errorf("preflight config.toml names no owner:\n%s", conf)
	}
	cr := Find(objs, "ClusterRole", "faultline-preflight-webhook")
	if cr == nil {
		t.Fatal("no ClusterRole faultline-preflight-webhook")
	}
	canGet := false
	for _, r := range mustSlice(cr.Object, "rules") {
		r := r.(map[string]any)
		if fmt.Sprint(r["apiGroups"], r["resources"], r["resourceNames"], r["verbs"]) == "[rbac.authorization.k8s.io] [clusterroles] [faultline-preflight-webhook] [get]" {
			canGet = true
		}
	}
	if !canGet {
		t.Errorf("the webhook may not get its ClusterRole: %v", cr.Object["rules"])
	}
	conf, err = ConfigTOML(render(t, "default", "--set", "rbac.create=false"), "faultline-preflight")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(conf, "owner_cluster_role") {
		t.Errorf("rbac.create false: the config names an owner the chart does not make:\n%s", conf)
	}
}

// rolesIn returns the Roles of that name by namespace.
func rolesIn(objs []*unstructured.Unstructured, name string) map[string]*unstructured.Unstructured {
	out := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		if o.GetKind() == "Role" && o.GetName() == name {
			out[o.GetNamespace()] = o
		}
	}
	return out
}

// grants reports whether role has a rule with that resource and verb,
// and its resourceNames (nil: every object).
func grants(role *unstructured.Unstructured, resource, verb string) (bool, []string) {
	rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
	for _, r := range rules {
		m, _ := r.(map[string]any)
		res, _, _ := unstructured.NestedStringSlice(m, "resources")
		verbs, _, _ := unstructured.NestedStringSlice(m, "verbs")
		if slices.Contains(res, resource) && slices.Contains(verbs, verb) {
			names, _, _ := unstructured.NestedStringSlice(m, "resourceNames")
			return true, names
		}
	}
	return false, nil
}

// TestQuarantineBreakerEvents: the quarantine role records
// QuarantineBreakerOpen/Closed Events on the breaker's ConfigMap, in
// quarantine.breaker.namespace, and its node Events in
// quarantine.event_namespace: it may create Events in both. Before, a
// breaker namespace other than the event namespace got the ConfigMap's
// rights only, and the breaker's Events were Forbidden.
func TestQuarantineBreakerEvents(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		nss  []string
	}{
		{"the secure set (events in faultline-events, breaker in faultline)", nil, []string{"faultline-events", "faultline"}},
		{"defaults (both in default)", []string{"--set", "config.quarantine.event_namespace=default", "--set", "config.quarantine.breaker.namespace=default"}, []string{"default"}},
		{"breaker elsewhere", []string{"--set", "config.quarantine.event_namespace=default", "--set", "config.quarantine.breaker.namespace=ops"}, []string{"default", "ops"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			roles := rolesIn(render(t, "secure", tc.args...), "faultline-quarantine")
			if len(roles) != len(tc.nss) {
				t.Fatalf("quarantine Roles in %v, want %v", slices.Collect(maps.Keys(roles)), tc.nss)
			}
			for _, ns := range tc.nss {
				r := roles[ns]
				if r == nil {
					t.Fatalf("no quarantine Role in %s", ns)
				}
				if ok, names := grants(r, "events", "create"); !ok || names != nil {
					t.Errorf("quarantine Role in %s: events create %v (names %v), want granted", ns, ok, names)
				}
			}
		})
	}
}

// TestJanitorSecretsByName: the janitor reads only janitor.redfish's
// default_secret and the Secrets allowed_secrets lists, so its Role names
// them: the release namespace holds the gateway tokens, the Kafka and
// ClickHouse passwords and the member clusters' kubeconfigs too. Before,
// it could read every Secret there. A prefix (name*) cannot be bound to
// names: with one, the rule stays namespace-wide (the chart's README says
// to keep such Secrets in a namespace of their own).
func TestJanitorSecretsByName(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string // nil: every Secret of the namespace
	}{
		{"default secret only", []string{"--set-json", "config.janitor.redfish.allowed_secrets=[]"}, []string{"bmc-credentials"}},
		{"names", []string{"--set", "config.janitor.redfish.allowed_secrets={bmc-a,bmc-b,bmc-credentials}"}, []string{"bmc-credentials", "bmc-a", "bmc-b"}},
		{"own default", []string{"--set", "config.janitor.redfish.default_secret=bmc-main", "--set", "config.janitor.redfish.allowed_secrets={bmc-a}"}, []string{"bmc-main", "bmc-a"}},
		{"a prefix", []string{"--set", "config.janitor.redfish.allowed_secrets={bmc-a,bmc-rack-*}"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Find(render(t, "secure", tc.args...), "Role", "faultline-janitor-bmc-credentials")
			if r == nil {
				t.Fatal("no janitor Secret Role")
			}
			ok, names := grants(r, "secrets", "get")
			if !ok || !slices.Equal(names, tc.want) {
				t.Errorf("secrets get: %v, names %q; want %q", ok, names, tc.want)
			}
		})
	}
}

// TestPreflightThroughAgentRelay: by default the preflight checks send
// through the node agent's relay socket, with the agent's node-bound
// credential, and get no gateway token (which every node's checks would
// share: a cluster-wide credential in tenants' namespaces). The agent
// serves the socket in agent.relay.hostDir with agent.relay.group, as its
// supplemental group (a non-root agent is given the directory first); the
// webhook mounts that directory into the checks and adds the group to
// their pods. preflight.tokenSecret is the legacy path; without it, a
// chart without the agent's relay is refused.
func TestPreflightThroughAgentRelay(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		hostDir string
		group   int64
		token   string
		nonRoot bool
	}{
		{name: "default", hostDir: "/run/faultline-agent", group: 64500},
		{name: "non-root agent", args: []string{"--set", "agent.checks={nic}", "--set", "agent.podResources=false"}, hostDir: "/run/faultline-agent", group: 64500, nonRoot: true},
		{name: "own directory and group", args: []string{"--set", "agent.relay.hostDir=/var/run/fl/", "--set", "agent.relay.group=7000"}, hostDir: "/var/run/fl", group: 7000},
		{name: "legacy token", args: []string{"--set", "preflight.tokenSecret=faultline-preflight-token"}, hostDir: "/run/faultline-agent", group: 64500, token: "faultline-preflight-token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, "default", tc.args...)
			ds := Find(objs, "DaemonSet", "faultline-agent")
			spec, _, _ := unstructured.NestedMap(ds.Object, "spec", "template", "spec")
			groups, _, _ := unstructured.NestedSlice(spec, "securityContext", "supplementalGroups")
			if !slices.ContainsFunc(groups, func(g any) bool { return fmt.Sprint(g) == fmt.Sprint(tc.group) }) {
				t.Errorf("agent supplementalGroups %v, want the socket's group %d", groups, tc.group)
			}
			var relayVol map[string]any
			for _, v := range mustSlice(ds.Object, "spec", "template", "spec", "volumes") {
				if v := v.(map[string]any); v["name"] == "relay" {
					relayVol = v
				}
			}
			if p, _, _ := unstructured.NestedString(relayVol, "hostPath", "path"); p != tc.hostDir {
				t.Errorf("agent relay volume %v, want hostPath %s", relayVol, tc.hostDir)
			}
			var inits []string
			for _, c := range mustSlice(ds.Object, "spec", "template", "spec", "initContainers") {
				inits = append(inits, c.(map[string]any)["name"].(string))
			}
			if slices.Contains(inits, "relay-owner") != tc.nonRoot {
				t.Errorf("init containers %q, want relay-owner exactly when the agent is not root", inits)
			}
			agentConf, err := ConfigTOML(objs, "faultline-agent")
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{`nvsentinel_socket = "/run/faultline-agent/agent.sock"`, fmt.Sprintf(`nvsentinel_socket_group = "%d"`, tc.group)} {
				if !strings.Contains(agentConf, want) {
					t.Errorf("agent config.toml lacks %q:\n%s", want, agentConf)
				}
			}
			conf, err := ConfigTOML(objs, "faultline-preflight")
			if err != nil {
				t.Fatal(err)
			}
			want := []string{fmt.Sprintf(`relay_socket = "%s/agent.sock"`, tc.hostDir), fmt.Sprintf("relay_socket_group = %d", tc.group), `token_secret = ""`}
			if tc.token != "" {
				want = []string{fmt.Sprintf("token_secret = %q", tc.token)}
				if strings.Contains(conf, "relay_socket") {
					t.Errorf("preflight config.toml has a relay socket beside the token:\n%s", conf)
				}
			}
			for _, w := range want {
				if !strings.Contains(conf, w) {
					t.Errorf("preflight config.toml lacks %q:\n%s", w, conf)
				}
			}
		})
	}
	helm := testenv.Helm(t)
	refused(t, helm, []string{"agent.relay.enabled=false"}, "preflight: the checks send through the node agent's relay socket")
	refused(t, helm, []string{"agent.enabled=false"}, "preflight: the checks send through the node agent's relay socket")
	refused(t, helm, []string{"agent.relay.hostDir=/"}, "hostDir")
}

// TestAgentPriorityClass: the agents run at agent.priorityClassName
// (system-node-critical by default; none when empty), and
// agent.criticalPodsQuota adds the ResourceQuota GKE wants before it
// admits pods of that class outside kube-system; without one the agent
// DaemonSet gets no pod at all.
func TestAgentPriorityClass(t *testing.T) {
	for _, tc := range []struct {
		name      string
		args      []string
		wantClass string // "": no priorityClassName
		wantQuota bool
	}{
		{"default", nil, "system-node-critical", false},
		{"own class", []string{"--set", "agent.priorityClassName=gpu-agents"}, "gpu-agents", false},
		{"no class", []string{"--set", "agent.priorityClassName="}, "", false},
		{"GKE quota", []string{"--set", "agent.criticalPodsQuota=true"}, "system-node-critical", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, "default", tc.args...)
			ds := Find(objs, "DaemonSet", "faultline-agent")
			if ds == nil {
				t.Fatal("no agent DaemonSet")
			}
			class, _, _ := unstructured.NestedString(ds.Object, "spec", "template", "spec", "priorityClassName")
			if class != tc.wantClass {
				t.Errorf("priorityClassName %q, want %q", class, tc.wantClass)
			}
			q := Find(objs, "ResourceQuota", "faultline-agent-critical-pods")
			if (q != nil) != tc.wantQuota {
				t.Fatalf("ResourceQuota rendered %v, want %v", q != nil, tc.wantQuota)
			}
			if q == nil {
				return
			}
			if q.GetNamespace() != namespace {
				t.Errorf("ResourceQuota in namespace %q, want %q", q.GetNamespace(), namespace)
			}
			exprs, _, _ := unstructured.NestedSlice(q.Object, "spec", "scopeSelector", "matchExpressions")
			want := []any{map[string]any{"scopeName": "PriorityClass", "operator": "In", "values": []any{tc.wantClass}}}
			if fmt.Sprint(exprs) != fmt.Sprint(want) {
				t.Errorf("scopeSelector %v, want %v", exprs, want)
			}
			if pods, _, _ := unstructured.NestedString(q.Object, "spec", "hard", "pods"); pods == "" {
				t.Error("ResourceQuota sets no hard pods")
			}
		})
	}
	refused(t, testenv.Helm(t), []string{"agent.criticalPodsQuota=true", "agent.priorityClassName="}, "agent.criticalPodsQuota needs agent.priorityClassName")
}

// TestPreflightSpreadOverNodes: the preflight webhook's replicas (its
// failurePolicy is Fail) prefer different nodes, as every faultline
// Deployment's do, so one node's reboot does not refuse every pod of the
// opted-in namespaces; preflight.affinity replaces that.
func TestPreflightSpreadOverNodes(t *testing.T) {
	spread := map[string]any{"podAntiAffinity": map[string]any{
		"preferredDuringSchedulingIgnoredDuringExecution": []any{map[string]any{
			"weight": int64(100),
			"podAffinityTerm": map[string]any{
				"topologyKey": "kubernetes.io/hostname",
				"labelSelector": map[string]any{"matchLabels": map[string]any{
					"app.kubernetes.io/name":      "faultline",
					"app.kubernetes.io/instance":  release,
					"app.kubernetes.io/component": "preflight",
				}},
			},
		}},
	}}
	zones := `{"podAntiAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":[{"topologyKey":"topology.kubernetes.io/zone","labelSelector":{"matchLabels":{"app.kubernetes.io/component":"preflight"}}}]}}`
	own := map[string]any{"podAntiAffinity": map[string]any{
		"requiredDuringSchedulingIgnoredDuringExecution": []any{map[string]any{
			"topologyKey":   "topology.kubernetes.io/zone",
			"labelSelector": map[string]any{"matchLabels": map[string]any{"app.kubernetes.io/component": "preflight"}},
		}},
	}}
	for _, tc := range []struct {
		name string
		args []string
		want map[string]any
	}{
		{"default", nil, spread},
		{"preflight.affinity", []string{"--set-json", "preflight.affinity=" + zones}, own},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Find(render(t, "default", tc.args...), "Deployment", "faultline-preflight")
			if d == nil {
				t.Fatal("no preflight Deployment")
			}
			got, _, _ := unstructured.NestedMap(d.Object, "spec", "template", "spec", "affinity")
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("affinity\n%v\nwant\n%v", got, tc.want)
			}
		})
	}
}

// TestPreflightOneReplicaFailClosed: with failure_policy Fail (the
// default) a single webhook replica is refused at render, naming
// preflight.replicas and the failure policy key: a drain (the PDB's
// maxUnavailable 1 lets it evict that replica) or any restart of it
// refused every pod CREATE in the opted-in namespaces, the drained
// workloads' replacements too, until a new one was ready. One replica
// with failure_policy Ignore renders (a missing webhook admits pods
// without the checks).
func TestPreflightOneReplicaFailClosed(t *testing.T) {
	helm := testenv.Helm(t)
	for _, set := range [][]string{
		{"preflight.replicas=1"},
		{"preflight.replicas=1", "preflight.config.webhook.failure_policy=Fail"},
	} {
		refused(t, helm, set, "preflight.replicas")
		refused(t, helm, set, "preflight.config.webhook.failure_policy")
	}
	for _, args := range [][]string{
		{"--set", "preflight.replicas=1", "--set", "preflight.config.webhook.failure_policy=Ignore"},
		{"--set", "preflight.replicas=1", "--set", "preflight.enabled=false"},
		{"--set", "preflight.replicas=3"},
	} {
		objs := render(t, "default", args...)
		if d := Find(objs, "Deployment", "faultline-preflight"); d == nil && !slices.Contains(args, "preflight.enabled=false") {
			t.Errorf("%v: no preflight Deployment", args)
		}
	}
}

// TestPreflightGracePeriodCoversDrain: told to stop, the webhook keeps
// answering for webhook.DrainDelay, not ready, then shuts down within 5s;
// the pod's grace period must cover both or the kubelet kills it while the
// API server still calls it.
func TestPreflightGracePeriodCoversDrain(t *testing.T) {
	d := Find(render(t, "default"), "Deployment", "faultline-preflight")
	if d == nil {
		t.Fatal("no preflight Deployment")
	}
	grace, ok, _ := unstructured.NestedInt64(d.Object, "spec", "template", "spec", "terminationGracePeriodSeconds")
	if !ok {
		grace = 30 // Kubernetes' default
	}
	if need := webhook.DrainDelay + 5*time.Second; time.Duration(grace)*time.Second < need {
		t.Errorf("terminationGracePeriodSeconds %d, under the webhook's drain and shutdown (%v)", grace, need)
	}
}

// TestRelaySpoolMinimum: with the relay on (the default since the preflight
// checks send through it) the agent refuses spool.max_bytes below 5 MiB
// (relay.MinSpoolBytes; 64 KiB without it), so an install with a smaller
// agent.config.spool.max_bytes upgraded into a crash-looping agent. The
// chart refuses it at render, naming both keys; 5 MiB, or the relay off,
// renders.
func TestRelaySpoolMinimum(t *testing.T) {
	helm := testenv.Helm(t)
	for _, set := range [][]string{{"agent.config.spool.max_bytes=1048576"}, {"agent.config.spool.max_bytes=5242879"}} {
		refused(t, helm, set, "agent.config.spool.max_bytes")
		refused(t, helm, set, "agent.relay.enabled")
	}
	if relay.MinSpoolBytes != 5242880 {
		t.Fatalf("relay.MinSpoolBytes is %d: the chart's minimum (templates/agent.yaml) is 5242880", relay.MinSpoolBytes)
	}
	for _, args := range [][]string{
		{"--set", "agent.config.spool.max_bytes=5242880"},
		{"--set", "agent.config.spool.max_bytes=1048576", "--set", "agent.relay.enabled=false", "--set", "preflight.tokenSecret=faultline-preflight-token"},
	} {
		conf, err := ConfigTOML(render(t, "default", args...), "faultline-agent")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(conf, "max_bytes = ") {
			t.Errorf("%v: agent config.toml lacks spool.max_bytes:\n%s", args, conf)
		}
	}
}

// TestAgentNVSentinelSocketValues: agent.config.nvsentinel_socket and
// nvsentinel_socket_group, valid values before the relay was the chart's,
// are not refused by the schema ("additional properties not allowed", a
// cryptic helm upgrade failure): with agent.relay on the chart refuses them
// pointing to agent.relay; with it off it honours them.
func TestAgentNVSentinelSocketValues(t *testing.T) {
	helm := testenv.Helm(t)
	for _, set := range [][]string{{"agent.config.nvsentinel_socket=/var/run/nvsentinel/nvsentinel.sock"}, {"agent.config.nvsentinel_socket_group=video"}} {
		refused(t, helm, set, "agent.relay")
		refused(t, helm, set, strings.Split(set[0], "=")[0])
	}
	conf, err := ConfigTOML(render(t, "default", "--set", "agent.relay.enabled=false", "--set", "preflight.tokenSecret=faultline-preflight-token",
		"--set", "agent.config.nvsentinel_socket=/var/run/nvsentinel/nvsentinel.sock", "--set-string", "agent.config.nvsentinel_socket_group=1000"), "faultline-agent")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`nvsentinel_socket = "/var/run/nvsentinel/nvsentinel.sock"`, `nvsentinel_socket_group = "1000"`} {
		if !strings.Contains(conf, want) {
			t.Errorf("agent config.toml lacks %q:\n%s", want, conf)
		}
	}
}
