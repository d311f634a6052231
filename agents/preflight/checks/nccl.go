package checks

import (
	"bufio"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/faultline/faultline/agents/preflight/nccl"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// The gang-wide benchmark, shipped in the binary and written to a
// temporary file for torchrun.
//
//go:embed allreduce_bench.py
var allreduceBench []byte

// Error codes of the NCCL checks besides nccl.Code.
const (
	CodeNCCLUnreadable = "NCCL_OUTPUT_UNREADABLE"
	CodeNCCLTestFailed = "NCCL_TEST_FAILED"
)

// topologyEnv returns the tools' environment with NCCL_TOPO_FILE set, in
// ADR-026's order: the pod's own (the webhook copied the variable and its
// volume mount), else the built-in file for the node's instance type,
// else none (NCCL detects the topology) unless nccl.topology_fallback is
// false.
func (e *Env) topologyEnv(ctx context.Context) ([]string, string, error) {
	env := slices.Clone(e.Child)
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "NCCL_TOPO_FILE="); ok && v != "" {
			return env, "pod:" + v, nil
		}
	}
	cfg := e.Cfg.NCCL
	itype := ""
	if kc := e.Kube(); kc != nil {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := kc.CoreV1().Nodes().Get(cctx, e.Cfg.NodeName, metav1.GetOptions{})
		cancel()
		if err != nil {
			e.Log.Warn("cannot read the node's labels; no instance-type topology", "err", err)
		} else {
			itype = n.Labels[cfg.InstanceTypeLabel]
		}
	}
	if file, ok := cfg.InstanceTypes[itype]; ok && itype != "" {
		path := filepath.Join(cfg.TopologyDir, file)
		if _, err := os.Stat(path); err == nil {
			return append(env, "NCCL_TOPO_FILE="+path), "instance-type:" + itype, nil
		}
		e.Log.Warn("topology file of the instance type is missing from the image", "instance_type", itype, "file", path)
	}
	if !cfg.TopologyFallback {
		return nil, "", configErr("topology", "nccl.topology_fallback: false, and no NCCL topology for instance type %q", itype)
	}
	return env, "nccl-auto", nil
}

// gangVerdict is what a failure of the gang-wide run says about this node:
// ADR-026's verdict, except for the failures a peer causes as much as this
// node, which cannot be placed on it and so are non-fatal (NONE): a remote
// error (a peer exited or its network failed — every other rank of the
// gang reports it), a system error (a socket or verbs call failed on a
// connection with some peer) and low bandwidth (one slow link). Fatal,
// they cordoned every healthy node of a gang because one of its nodes
// failed, or one of its pods was killed; the failing node's own checks
// and agents place it.
func gangVerdict(c nccl.Code) nccl.Verdict {
	switch c {
	case nccl.RemoteError, nccl.SystemError, nccl.BandwidthDegraded:
		return nccl.Verdict{Action: datamodels.RecommendedAction_NONE}
	}
	return nccl.Verdicts[c]
}

// ncclVerdict judges a finished NCCL run: an NCCL failure by ADR-026's
// table, then wrong data (corruption, whatever the bandwidth), then an
// unexplained non-zero exit, then the bandwidth at the largest size. gang:
// the run spans a gang's nodes, so its failures are judged by gangVerdict.
func (e *Env) ncclVerdict(check string, out output, threshold float64, gang bool, meta map[string]string) Outcome {
	node := nodeEntity(e.Cfg.NodeName)
	verdict := func(c nccl.Code) nccl.Verdict { return nccl.Verdicts[c] }
	if gang {
		verdict = gangVerdict
	}
	res, perr := nccl.Parse(strings.NewReader(out.Text))
	if res != nil {
		if w, ok := nccl.WorstBy(res.Failures, verdict); ok {
			v := verdict(w.Code)
			msg := fmt.Sprintf("%s failed: %s", check, w.Text)
			return Outcome{Failed: true, Codes: []string{string(w.Code)}, Summary: msg,
				Events: []*datamodels.HealthEvent{e.Unhealthy(v.Fatal, v.Action, msg, []string{string(w.Code)}, node, meta)}}
		}
	}
	if perr != nil {
		msg := fmt.Sprintf("%s output (exit %d) is unreadable: %v", check, out.ExitCode, perr)
		return Outcome{Failed: true, Codes: []string{CodeNCCLUnreadable}, Summary: msg,
			Events: []*datamodels.HealthEvent{e.Unhealthy(false, datamodels.RecommendedAction_NONE, msg, []string{CodeNCCLUnreadable}, node, meta)}}
	}
	if res.Wrong {
		v := verdict(nccl.DataCorruption)
		msg := fmt.Sprintf("%s: NCCL delivered wrong data (#wrong non-zero)", check)
		return Outcome{Failed: true, Codes: []string{string(nccl.DataCorruption)}, Summary: msg,
			Events: []*datamodels.HealthEvent{e.Unhealthy(v.Fatal, v.Action, msg, []string{string(nccl.DataCorruption)}, node, meta)}}
	}
	if out.ExitCode != 0 {
		msg := fmt.Sprintf("%s exited %d without naming an NCCL error", check, out.ExitCode)
		return Outcome{Failed: true, Codes: []string{CodeNCCLTestFailed}, Summary: msg,
			Events: []*datamodels.HealthEvent{e.Unhealthy(false, datamodels.RecommendedAction_NONE, msg, []string{CodeNCCLTestFailed}, node, meta)}}
	}
	bw, size, ok := measured(res)
	if !ok {
		msg := fmt.Sprintf("%s printed no result row and no Avg bus bandwidth", check)
		return Outcome{Failed: true, Codes: []string{CodeNCCLUnreadable}, Summary: msg,
			Events: []*datamodels.HealthEvent{e.Unhealthy(false, datamodels.RecommendedAction_NONE, msg, []string{CodeNCCLUnreadable}, node, meta)}}
	}
	meta = withMeta(meta, "preflight.faultline.io/busbw-gbps", strconv.FormatFloat(bw, 'f', 2, 64))
	if bw < threshold {
		v := verdict(nccl.BandwidthDegraded)
		msg := fmt.Sprintf("%s: bus bandwidth %.2f GB/s at %d bytes is below the threshold %.2f GB/s", check, bw, size, threshold)
		return Outcome{Failed: true, Codes: []string{string(nccl.BandwidthDegraded)}, Summary: msg,
			Events: []*datamodels.HealthEvent{e.Unhealthy(v.Fatal, v.Action, msg, []string{string(nccl.BandwidthDegraded)}, node, meta)}}
	}
	msg := fmt.Sprintf("%s passed: bus bandwidth %.2f GB/s at %d bytes (threshold %.2f GB/s)", check, bw, size, threshold)
	return Outcome{Summary: msg, Events: []*datamodels.HealthEvent{e.Healthy(msg, node, meta)}}
}

// measured is the bus bandwidth the check judges: the better of
// out-of-place and in-place at the largest message size (small sizes
// measure latency, not links), else the Avg bus bandwidth footer.
func measured(r *nccl.Result) (float64, int64, bool) {
	if len(r.Rows) == 0 {
		return r.AvgBusBw, 0, r.HasAvg
	}
	best := r.Rows[0]
	for _, row := range r.Rows {
		if row.Bytes > best.Bytes {
			best = row
		}
	}
	return max(best.BusBwOutOfPlace, best.BusBwInPlace), best.Bytes, true
}

// runLoopback: all_reduce_perf over the pod's GPUs (NVLink/PCIe, no
// network).
func runLoopback(ctx context.Context, env *Env) (Outcome, error) {
	cfg := env.Cfg.NCCL
	uuids, missing, err := env.podGPUs(ctx)
	if err != nil || missing != nil {
		return derefOutcome(missing), err
	}
	childEnv, topo, err := env.topologyEnv(ctx)
	if err != nil {
		return Outcome{}, err
	}
	args := strings.Fields(strings.ReplaceAll(cfg.LoopbackArgs, "{gpus}", strconv.Itoa(len(uuids))))
	out, err := run(ctx, env.Echo, childEnv, cfg.AllReducePerf, args...)
	if errors.Is(err, errNotFound) {
		return Outcome{}, configErr("all_reduce_perf", "nccl.all_reduce_perf: %v", err)
	}
	if err != nil {
		return Outcome{}, err
	}
	meta := map[string]string{"preflight.faultline.io/gpus": strings.Join(uuids, ","), "preflight.faultline.io/nccl-topology": topo}
	threshold := cfg.LoopbackThresholdGBps
	if len(uuids) < 2 {
		// One GPU: an all-reduce of one rank moves nothing between GPUs,
		// so nccl-tests reports a bus bandwidth of 0 (busbw = algbw ×
		// 2(n−1)/n) — no NVLink or PCIe path to judge. Judged against the
		// threshold, every healthy node running a one-GPU pod was
		// NCCL_BW_DEGRADED, fatal, and quarantined. NCCL failures and wrong
		// data still fail it.
		threshold = 0
		meta["preflight.faultline.io/bandwidth"] = "not judged: one GPU"
	}
	return env.ncclVerdict(NCCLLoopback, out, threshold, false, meta), nil
}

// gangState is what the mounted gang ConfigMap says.
type gangState struct {
	ID       string
	Expected int
	Master   string
	Peers    map[string]string // pod name -> IP
	// Finished are the peers whose check ended: the rendezvous is over
	// for them.
	Finished []string
	// Rerun are the gang's pods whose check failed in the pod and runs
	// again.
	Rerun []string
}

func readGang(dir string) (gangState, error) {
	var g gangState
	read := func(k string) (string, error) {
		b, err := os.ReadFile(filepath.Join(dir, k))
		if err != nil {
			return "", err
		}
		return strings.TrimSpace(string(b)), nil
	}
	g.ID, _ = read("gang_id")
	if s, err := read("expected_count"); err == nil && s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return g, fmt.Errorf("expected_count %q is not a positive number", s)
		}
		g.Expected = n
	}
	g.Master, _ = read("master_addr")
	g.Peers = map[string]string{}
	if s, err := read("peers"); err == nil {
		sc := bufio.NewScanner(strings.NewReader(s))
		for sc.Scan() {
			l := strings.TrimSpace(sc.Text())
			if l == "" {
				continue
			}
			name, ip, ok := strings.Cut(l, ":")
			if !ok || name == "" || ip == "" {
				return g, fmt.Errorf("peers line %q is not name:ip", l)
			}
			g.Peers[name] = ip
		}
	}
	if s, err := read("finished"); err == nil {
		for _, l := range strings.Fields(s) {
			if g.Peers[l] != "" {
				g.Finished = append(g.Finished, l)
			}
		}
	}
	if s, err := read("rerun"); err == nil {
		g.Rerun = strings.Fields(s)
	}
	return g, nil
}

// allreduceFailed is the marker, in gang.marker_dir, of a non-zero exit of
// nccl-allreduce in this pod. The directory is a pod-local emptyDir: it
// outlives the init container's restarts (and a recreated sandbox) but
// not the pod, so a replacement pod starts without it.
const allreduceFailed = "nccl-allreduce-failed"

// failedBefore says whether nccl-allreduce exited non-zero when it last
// ran in this pod.
func failedBefore(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, allreduceFailed))
	return err == nil
}

// recordAllreduceExit keeps the marker in step with nccl-allreduce's exit
// code, as the controller's "rerun" key follows the container's latest
// exit: written on a non-zero exit (a failure, a timeout, a check that
// could not run, a configuration error, events not recorded — the kubelet
// runs the check again for each), removed on exit 0 (a later run in the
// pod, after a recreated sandbox, may then skip on a finished peer). A
// directory that is not there (a pod injected by an earlier webhook) is
// logged: such a pod's first rerun relies on "rerun" alone.
func recordAllreduceExit(dir string, code int, log *slog.Logger) {
	p := filepath.Join(dir, allreduceFailed)
	if code == ExitPass {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			log.Warn("cannot remove the marker of an earlier failure of the gang-wide check", "err", err)
		}
		return
	}
	if err := os.WriteFile(p, []byte(strconv.Itoa(code)+"\n"), 0o644); err != nil {
		log.Warn("cannot leave the marker of this failure for the check's rerun (gang.marker_dir not mounted?): the rerun may pass on a peer that finished, until the gang ConfigMap lists this pod as rerun",
			"err", err)
	}
}

// runAllreduce waits for the gang in the mounted ConfigMap, ranks the pods
// by sorted name, and runs the torchrun command on this pod.
func runAllreduce(ctx context.Context, env *Env) (Outcome, error) {
	cfg := env.Cfg
	if cfg.Pod.Name == "" {
		return Outcome{}, configErr("gang", "pod.name: must be set to find this pod among its peers ($POD_NAME)")
	}
	if st, err := os.Stat(cfg.Gang.Dir); err != nil || !st.IsDir() {
		return Outcome{}, configErr("gang", "gang.dir: %s is not a directory (the gang ConfigMap is not mounted: not a gang pod?)", cfg.Gang.Dir)
	}
	start := env.Now()
	wctx, cancel := context.WithTimeout(ctx, cfg.Gang.Timeout)
	defer cancel()
	// The marker is there from the start: the kubelet runs the check again
	// about 10s after it failed, long before the mounted ConfigMap lists
	// the pod as rerun (its volume sync takes a minute or more).
	failedHere := failedBefore(cfg.Gang.MarkerDir)
	var g gangState
	var lastErr error
	warned := false
	for {
		var err error
		g, err = readGang(cfg.Gang.Dir)
		lastErr = err
		done := slices.DeleteFunc(slices.Clone(g.Finished), func(n string) bool { return n == cfg.Pod.Name })
		if err == nil && len(done) > 0 && !failedHere && !slices.Contains(g.Rerun, cfg.Pod.Name) {
			// A peer finished its check without this pod (a pod that
			// replaced one of the gang's, or whose sandbox was recreated
			// after its check passed): it takes part in no rendezvous any
			// more, and torchrun would wait for it until the check's
			// timeout, on every restart. The all-reduce cannot run; the
			// pod is not held. Not so for a pod whose own check failed
			// (its marker in gang.marker_dir, or listed as rerun): passing
			// it here would start the job on the node that failed; it
			// waits and fails again, and stays held.
			waited := env.Now().Sub(start)
			msg := fmt.Sprintf("gang %s: not run: peers %s already finished the gang-wide check without this pod", g.ID, strings.Join(done, ","))
			return Outcome{Summary: msg, Gang: g.ID, GangWait: waited}, nil
		}
		if err == nil && len(done) > 0 && !warned {
			warned = true
			env.Log.Warn("this pod's gang-wide check failed before and peers already finished it: running it again (it cannot pass without them; the pod stays held)",
				"gang", g.ID, "finished", strings.Join(done, ","), "marker", failedHere, "rerun", slices.Contains(g.Rerun, cfg.Pod.Name))
		}
		if err == nil && g.Expected > 0 && len(g.Peers) >= g.Expected && g.Peers[cfg.Pod.Name] != "" {
			break
		}
		select {
		case <-wctx.Done():
			waited := env.Now().Sub(start)
			if ctx.Err() != nil {
				return Outcome{}, ctx.Err()
			}
			msg := fmt.Sprintf("gang %s did not form within %s: %d of %d peers registered", g.ID, cfg.Gang.Timeout, len(g.Peers), g.Expected)
			if lastErr != nil {
				msg += " (" + lastErr.Error() + ")"
			}
			return Outcome{Failed: true, Codes: []string{CodeGangTimeout}, Summary: msg, Gang: g.ID, GangWait: waited,
				Events: []*datamodels.HealthEvent{env.Unhealthy(false, datamodels.RecommendedAction_NONE, msg, []string{CodeGangTimeout},
					nodeEntity(cfg.NodeName), map[string]string{"preflight.faultline.io/gang": g.ID})}}, nil
		case <-time.After(cfg.Gang.PollInterval):
		}
	}
	waited := env.Now().Sub(start)
	// The check's own time starts once the gang formed (Main allowed
	// gang.timeout on top of it).
	ctx, cancelCheck := context.WithTimeout(ctx, cfg.Timeout)
	defer cancelCheck()
	if len(g.Peers) != g.Expected {
		// More peers than the PodGroup's minMember (replicas above it, a
		// stale peer): ranks over them would reach past --nnodes, and pods
		// that read the list at different moments would disagree.
		msg := fmt.Sprintf("gang %s lists %d peers, expected %d: ranks cannot be assigned", g.ID, len(g.Peers), g.Expected)
		return Outcome{Failed: true, Codes: []string{CodeGangMismatch}, Summary: msg, Gang: g.ID, GangWait: waited,
			Events: []*datamodels.HealthEvent{env.Unhealthy(false, datamodels.RecommendedAction_NONE, msg, []string{CodeGangMismatch},
				nodeEntity(cfg.NodeName), map[string]string{"preflight.faultline.io/gang": g.ID})}}, nil
	}
	names := make([]string, 0, len(g.Peers))
	for n := range g.Peers {
		names = append(names, n)
	}
	slices.Sort(names)
	rank := slices.Index(names, cfg.Pod.Name)
	master := g.Peers[names[0]]
	if g.Master != "" && g.Master != master {
		env.Log.Warn("master_addr differs from the first peer's address; using the peer's", "master_addr", g.Master, "peer", names[0], "ip", master)
	}
	uuids, missing, err := env.podGPUs(ctx)
	if err != nil {
		return Outcome{}, err
	}
	if missing != nil {
		missing.Gang, missing.GangWait = g.ID, waited
		return *missing, nil
	}
	childEnv, topo, err := env.topologyEnv(ctx)
	if err != nil {
		return Outcome{}, err
	}
	script, err := os.CreateTemp("", "preflight-allreduce-*.py")
	if err != nil {
		return Outcome{}, fmt.Errorf("write the benchmark: %w", err)
	}
	defer os.Remove(script.Name())
	if _, err := script.Write(allreduceBench); err != nil {
		script.Close()
		return Outcome{}, fmt.Errorf("write the benchmark: %w", err)
	}
	script.Close()
	repl := strings.NewReplacer("{torchrun}", cfg.NCCL.Torchrun, "{nnodes}", strconv.Itoa(g.Expected),
		"{gpus}", strconv.Itoa(len(uuids)), "{rank}", strconv.Itoa(rank), "{master_addr}", master,
		"{master_port}", strconv.Itoa(cfg.NCCL.MasterPort), "{script}", script.Name())
	argv := strings.Fields(repl.Replace(cfg.NCCL.AllreduceCommand))
	if len(argv) == 0 {
		return Outcome{}, configErr("allreduce_command", "nccl.allreduce_command: empty")
	}
	childEnv = append(childEnv, "PREFLIGHT_ALLREDUCE_BYTES="+strconv.FormatInt(cfg.NCCL.AllreduceBytes, 10),
		"MASTER_ADDR="+master, "MASTER_PORT="+strconv.Itoa(cfg.NCCL.MasterPort))
	env.Log.Info("gang formed; starting the all-reduce", "gang", g.ID, "rank", rank, "nnodes", g.Expected, "master", master, "waited", waited.String())
	out, err := run(ctx, env.Echo, childEnv, argv[0], argv[1:]...)
	if errors.Is(err, errNotFound) {
		return Outcome{}, configErr("torchrun", "nccl.allreduce_command: %v", err)
	}
	if err != nil {
		return Outcome{}, err
	}
	meta := map[string]string{"preflight.faultline.io/gang": g.ID, "preflight.faultline.io/rank": strconv.Itoa(rank),
		"preflight.faultline.io/peers": strings.Join(names, ","), "preflight.faultline.io/nccl-topology": topo,
		"preflight.faultline.io/gpus": strings.Join(uuids, ",")}
	o := env.ncclVerdict(NCCLAllreduce, out, cfg.NCCL.AllreduceThresholdGBps, true, meta)
	o.Gang, o.GangWait = g.ID, waited
	return o, nil
}
