package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

var update = flag.Bool("update", false, "rewrite the golden files")

type fakeRunner struct {
	out   map[string]string // command name → output
	err   map[string]error
	calls []string
}

func (f *fakeRunner) Run(_ context.Context, name string, args ...string) ([]byte, error) {
	f.calls = append(f.calls, name+" "+strings.Join(args, " "))
	if err := f.err[name]; err != nil {
		return nil, err
	}
	return []byte(f.out[name]), nil
}

func read(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		os.WriteFile(path, got, 0o644)
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -update creates it)", err)
	}
	if string(got) != string(want) {
		t.Errorf("%s differs (go test -update rewrites it); got:\n%s", path, got)
	}
}

func encode(t *testing.T, evs []*datamodels.HealthEvent) []byte {
	var b strings.Builder
	for _, ev := range evs {
		ev.GeneratedTimestamp = nil
		j, err := protojson.MarshalOptions{EmitDefaultValues: true}.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		var v any
		json.Unmarshal(j, &v)
		j, _ = json.Marshal(v)
		b.Write(j)
		b.WriteByte('\n')
	}
	return []byte(b.String())
}

// TestParseSMIGolden: the Fabric sections of nvidia-smi -q samples.
func TestParseSMIGolden(t *testing.T) {
	files, _ := filepath.Glob("testdata/smi-*.txt")
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			got, _ := json.MarshalIndent(ParseSMI(read(t, f)), "", "  ")
			golden(t, strings.TrimSuffix(f, ".txt")+".golden.json", append(got, '\n'))
		})
	}
}

type env struct {
	c   *Check
	r   *fakeRunner
	now time.Time
	dir string
}

func newEnv(t *testing.T, switches int) *env {
	dir := t.TempDir()
	for i := 0; i < switches; i++ {
		os.WriteFile(filepath.Join(dir, "nvidia-nvswitch"+string(rune('0'+i))), nil, 0o644)
	}
	e := &env{r: &fakeRunner{out: map[string]string{
		"systemctl":  "LoadState=loaded\nActiveState=active\nSubState=running\nResult=success\n",
		"nvidia-smi": read(t, "testdata/smi-hgx-healthy.txt"),
	}}, now: time.Date(2024, 10, 28, 10, 0, 0, 0, time.UTC), dir: dir}
	c, err := New(Config{NVSwitchGlob: filepath.Join(dir, "nvidia-nvswitch[0-9]*"), LogFile: filepath.Join(dir, "fabricmanager.log"),
		Runner: e.r, Now: func() time.Time { return e.now }})
	if err != nil {
		t.Fatal(err)
	}
	e.c = c
	return e
}

func (e *env) run(t *testing.T) []*datamodels.HealthEvent {
	t.Helper()
	evs, err := e.c.Check(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

func codes(evs []*datamodels.HealthEvent) string {
	var s []string
	for _, ev := range evs {
		c := ev.CheckName + ":"
		if ev.IsHealthy {
			c += "healthy"
		} else {
			c += ev.ErrorCode[0]
		}
		for _, en := range ev.EntitiesImpacted {
			if en.EntityType == "GPU" || en.EntityType == "NVSwitch" {
				c += "@" + en.EntityValue
				break
			}
		}
		s = append(s, c)
	}
	return strings.Join(s, " ")
}

// TestGPUFabricStates: Completed+Success is healthy; a failure status and an
// unhealthy summary are fatal; In Progress is reported only after the
// timeout; everything recovers with a healthy event.
func TestGPUFabricStates(t *testing.T) {
	e := newEnv(t, 4)
	if evs := e.run(t); len(evs) != 0 {
		t.Fatalf("healthy system: %s", codes(evs))
	}
	e.r.out["nvidia-smi"] = read(t, "testdata/smi-hgx-h100.txt")
	evs := e.run(t)
	want := "GPUFabricState:FABRIC-PROBE-FAILURE@GPU-11111111-0000-0000-0000-00000000003a " +
		"GPUFabricHealth:FABRIC-UNHEALTHY@GPU-11111111-0000-0000-0000-00000000003a " +
		"GPUFabricHealth:FABRIC-BANDWIDTH-DEGRADED@GPU-11111111-0000-0000-0000-00000000005d"
	if got := codes(evs); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if !evs[0].IsFatal || evs[0].RecommendedAction != datamodels.RecommendedAction_RESTART_BM || evs[0].Metadata["recovery"] == "" {
		t.Errorf("probe failure: %v", evs[0])
	}
	if evs[2].IsFatal {
		t.Errorf("degraded bandwidth must not be fatal")
	}
	golden(t, "testdata/smi-hgx-h100.events.golden.jsonl", encode(t, evs))
	e.now = e.now.Add(4 * time.Minute)
	if evs := e.run(t); len(evs) != 0 {
		t.Fatalf("standing state reported again: %s", codes(evs))
	}
	e.now = e.now.Add(2 * time.Minute)
	if got := codes(e.run(t)); got != "GPUFabricState:FABRIC-PROBE-TIMEOUT@GPU-11111111-0000-0000-0000-00000000002a" {
		t.Fatalf("in progress too long: %s", got)
	}
	e.r.out["nvidia-smi"] = read(t, "testdata/smi-hgx-healthy.txt")
	// 3a and 5d vanish from the sample; 18 and 2a are healthy again.
	got := codes(e.run(t))
	if got != "GPUFabricState:healthy@GPU-11111111-0000-0000-0000-00000000002a" {
		t.Fatalf("recovery: %s", got)
	}
}

// TestNoNVSwitch: a PCIe system without NVSwitches is never flagged and
// systemctl is not asked.
func TestNoNVSwitch(t *testing.T) {
	e := newEnv(t, 0)
	e.r.out["nvidia-smi"] = read(t, "testdata/smi-pcie-no-nvswitch.txt")
	e.r.out["systemctl"] = "LoadState=not-found\nActiveState=inactive\n"
	if evs := e.run(t); len(evs) != 0 {
		t.Fatalf("flagged: %s", codes(evs))
	}
	for _, c := range e.r.calls {
		if strings.HasPrefix(c, "systemctl") {
			t.Errorf("systemctl called without NVSwitches: %s", c)
		}
	}
	e.r.err = map[string]error{"nvidia-smi": exec.ErrNotFound}
	if evs, err := e.c.Check(context.Background()); err != nil || len(evs) != 0 {
		t.Fatalf("no driver: %v %v", evs, err)
	}
}

func TestServiceState(t *testing.T) {
	e := newEnv(t, 2)
	if evs := e.run(t); len(evs) != 0 {
		t.Fatal(codes(evs))
	}
	e.r.out["systemctl"] = "LoadState=loaded\nActiveState=failed\nSubState=failed\nResult=exit-code\n"
	evs := e.run(t)
	if got := codes(evs); got != "FabricManagerService:FM-SERVICE-FAILED@nvidia-nvswitch0" || !evs[0].IsFatal {
		t.Fatalf("failed service: %s", got)
	}
	if evs := e.run(t); len(evs) != 0 {
		t.Fatalf("reported twice: %s", codes(evs))
	}
	e.r.out["systemctl"] = "LoadState=not-found\nActiveState=inactive\nSubState=dead\n"
	if got := codes(e.run(t)); got != "FabricManagerService:FM-SERVICE-NOT-INSTALLED@nvidia-nvswitch0" {
		t.Fatalf("not installed: %s", got)
	}
	e.r.out["systemctl"] = "LoadState=loaded\nActiveState=active\nSubState=running\nResult=success\n"
	if evs := e.run(t); len(evs) != 1 || !evs[0].IsHealthy {
		t.Fatalf("recovery: %s", codes(evs))
	}
	e.r.err = map[string]error{"systemctl": errors.New("boom")}
	if _, err := e.c.Check(context.Background()); err == nil {
		t.Error("systemctl failure not returned")
	}
}

// TestLogFile: FM log lines (golden), read incrementally.
func TestLogFile(t *testing.T) {
	e := newEnv(t, 1)
	path := filepath.Join(e.dir, "fabricmanager.log")
	os.WriteFile(path, []byte(read(t, "testdata/fabricmanager.log")), 0o644)
	evs := e.run(t)
	golden(t, "testdata/fabricmanager.golden.jsonl", encode(t, evs))
	want := "FabricManagerNVLinkTraining:FM-NVLINK-TRAINING-FAILURE FabricManagerNVSwitchError:SXID-12020@0000:07:00.0 " +
		"FabricManagerNVSwitchError:SXID-20001@0000:08:00.0 FabricManagerInit:FM-INIT-FAILURE FabricManagerInit:FM-INIT-FAILURE"
	if got := codes(evs); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	if !evs[1].IsFatal || evs[2].IsFatal {
		t.Errorf("fatal/non-fatal NVSwitch errors: %v %v", evs[1].IsFatal, evs[2].IsFatal)
	}
	if evs := e.run(t); len(evs) != 0 {
		t.Fatalf("re-read: %s", codes(evs))
	}
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.WriteString("[Oct 28 2024 11:00:00] [ERROR] [tid 9] Fabric Manager failed to initialize NVSwitch 2\n")
	f.Close()
	if got := codes(e.run(t)); got != "FabricManagerInit:FM-INIT-FAILURE" {
		t.Fatalf("appended: %s", got)
	}
}
