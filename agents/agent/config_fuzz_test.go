package agent

import (
	"io"
	"os"
	"path/filepath"
	"testing"
)

// FuzzLoadConfig: whatever the agent's config file holds, loading it does
// not panic (the agent would crash-loop on the node without saying why):
// it is refused with a message, or it gives a config that validates again
// as it stands.
func FuzzLoadConfig(f *testing.F) {
	f.Add("node_name = \"gpu-node-42\"\n[gateway]\naddr = \"faultline-gateway.faultline.svc:50051\"\ntoken_file = \"/var/run/secrets/faultline/token\"\n" +
		"[nic]\nsysfs_root = \"/host/sys\"\nproc_net_route = \"/host/proc/net/route\"\nboot_id_path = \"/host/proc/sys/kernel/random/boot_id\"\n")
	f.Add("[local_actions]\nlisten = \"10.0.0.7:9477\"\nverify_key_file = \"/etc/faultline/local-actions.pub\"\nreboot_command = [\"systemctl\", \"reboot\"]\n" +
		"gpu_reset_command = [\"nvidia-smi\", \"-r\", \"-i\", \"{uuid}\"]\npods_gone_timeout = \"2m\"\ncommand_timeout = \"2m\"\n")
	f.Add("checks = [\"nic\", \"csp\"]\n[csp]\nmetadata_url = \"http://metadata.google.internal/computeMetadata/v1/instance\"\npoll_interval = \"30s\"\n")
	f.Add("checks = [\"nic\", \"conformance\"]\n[conformance]\ninterval = \"6h\"\nos_image_file = \"/etc/os-image\"\n" +
		"[[conformance.components]]\nname = \"ofed\"\ncommand = [\"ofed_info\", \"-s\"]\npattern = 'OFED-internal-(\\S+):'\n")
	f.Add("checks = [\"kmsg\", \"fabric\"]\n[kmsg]\nsource = \"file\"\nfile = \"/var/log/kern.log\"\n[spool]\nmax_bytes = 1048576\n")
	f.Add("[gateway]\ntimeout = 5\n[nic]\nstate_polling_interval = \"-1s\"\nnic_exclusion_regex = \"([\"\n")
	f.Add("[[gateway]]\n[nic.x]\nchecks = 1\n")
	dir := f.TempDir()
	env := func(string) string { return "gpu-node-1" }
	f.Fuzz(func(t *testing.T, file string) {
		path := filepath.Join(dir, "agent.toml")
		if err := os.WriteFile(path, []byte(file), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err := loadConfig("faultline-agent", []string{"--config", path}, env, io.Discard)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("refused with no message")
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("loaded, then refused on a second validation: %v", err)
		}
	})
}
