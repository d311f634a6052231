package fabric

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/faultline/faultline/schemas/events"
	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// --- GPU and NVSwitch exclusion ---

// exclusionConds compares what the configuration asks to exclude, what the
// drivers excluded and what is present:
//
//   - GPU-EXCLUDED: the driver's view (information file "GPU Excluded:
//     Yes", or nvidia-smi -B).
//   - GPU-EXCLUDE-LISTED-NOT-PRESENT: in NVreg_ExcludedGpus but on no bus:
//     the guide says such a GPU is not excluded (it was replaced, or its
//     enumeration failed).
//   - GPU-EXCLUDE-PENDING-REBOOT: listed, present and not excluded: the
//     module parameter takes effect at the next driver load.
//   - GPU-EXCLUSION-CANDIDATE: a GPU that fails to enumerate (in the
//     node's GPU list or on the PCI bus, but not served by the driver).
//
// and the same for NVSwitches (NvSwitchExcludelist against the switches on
// the PCI bus and those the NVSwitch driver bound).
func (e *Evaluator) exclusionConds(s *Snapshot) []cond {
	var cs []cond
	listed := &ExcludeList{}
	if s.Excludes != nil {
		listed = s.Excludes
	}
	excluded := map[string]GPUInformation{} // UUID (or PCI) → info
	served := map[string]bool{}             // UUIDs and PCIs the driver serves, excluded or not
	for _, g := range s.GPUInfo {
		if g.UUID != "" {
			served[g.UUID] = true
		}
		if g.PCI != "" {
			served[pci4(g.PCI)] = true
		}
		if g.Excluded {
			excluded[firstNonEmpty(g.UUID, g.PCI)] = g
		}
	}
	for _, g := range s.ExcludedListed {
		if _, ok := excluded[g.UUID]; !ok {
			excluded[firstNonEmpty(g.UUID, g.PCI)] = g
		}
		served[g.UUID] = true
	}
	visible := map[string]bool{} // GPUs nvidia-smi shows (not excluded)
	if s.SMI != nil {
		for _, g := range s.SMI.GPUs {
			if g.UUID != "" {
				visible[g.UUID] = true
				served[g.UUID] = true
			}
			if g.PCI != "" {
				visible[pci4(g.PCI)] = true
				served[pci4(g.PCI)] = true
			}
		}
	}
	guide := "Manual Degradation: GPU Exclusion (In-Band GPU Exclude Mechanism, Listing Excluded GPUs)"
	ids := make([]string, 0, len(excluded))
	for id := range excluded {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		g := excluded[id]
		meta := map[string]string{"guide": guide, "pci_bus_id": g.PCI, "model": g.Model, "listed": strconv.FormatBool(contains(listed.GPUs, g.UUID)),
			"recovery": "The driver excluded this GPU (it is invisible to CUDA and nvidia-smi -q); after replacing it, remove its UUID from NVreg_ExcludedGpus and reboot."}
		cs = append(cs, cond{"gpu-excluded|" + id, e.ev(s.Now, classGPU, CheckGPUExcl, "GPU-EXCLUDED", false, datamodels.RecommendedAction_NONE,
			fmt.Sprintf("GPU %s is excluded by the driver (NVreg_ExcludedGpus)", id), gpuEntities(id, g.PCI), meta)})
	}
	knowsPresence := s.SMI != nil || s.GPUInfo != nil
	for _, u := range listed.GPUs {
		if _, ok := excluded[u]; ok || !knowsPresence {
			continue
		}
		meta := map[string]string{"guide": guide, "sources": strings.Join(listed.Sources, ",")}
		if visible[u] {
			meta["recovery"] = "The exclude list names this GPU but the loaded driver does not exclude it: reboot (or reload nvidia.ko) to apply NVreg_ExcludedGpus."
			cs = append(cs, cond{"gpu-pending|" + u, e.ev(s.Now, classGPU, CheckGPUExcl, "GPU-EXCLUDE-PENDING-REBOOT", false, datamodels.RecommendedAction_NONE,
				fmt.Sprintf("GPU %s is in NVreg_ExcludedGpus but still in use: the parameter applies at the next driver load", u), gpuEntities(u, ""), meta)})
			continue
		}
		meta["recovery"] = "A UUID in the exclude list that is not detected (a replaced GPU, or one whose PCIe enumeration failed) is not excluded, per the guide; remove it from the list once the GPU is replaced."
		cs = append(cs, cond{"gpu-listed|" + u, e.ev(s.Now, classGPU, CheckGPUExcl, "GPU-EXCLUDE-LISTED-NOT-PRESENT", false, datamodels.RecommendedAction_NONE,
			fmt.Sprintf("GPU %s is in NVreg_ExcludedGpus but not present: it is not excluded", u), gpuEntities(u, ""), meta)})
	}
	// Candidates: GPUs that fail to enumerate.
	if s.SMI != nil || s.GPUInfo != nil {
		cand := func(id, pci, reason string) {
			if contains(listed.GPUs, id) {
				return
			}
			meta := map[string]string{"reason": reason, "guide": "Manual Degradation: GPU Exclusion (GPU failure to enumerate on the PCIe bus)",
				"recovery": "Reboot to re-enumerate the GPU; if it stays missing, diagnose/RMA it and add its UUID to NVreg_ExcludedGpus so FM configures the other GPUs."}
			cs = append(cs, cond{"gpu-candidate|" + firstNonEmpty(id, pci), e.ev(s.Now, classGPU, CheckGPUExcl, "GPU-EXCLUSION-CANDIDATE", true,
				datamodels.RecommendedAction_RESTART_BM, fmt.Sprintf("GPU %s is an exclusion candidate: %s", firstNonEmpty(id, pci), reason),
				gpuEntities(firstNonEmpty(id, pci), pci), meta)})
		}
		for _, x := range s.ExpectedGPUs {
			if (x.UUID != "" && served[x.UUID]) || (x.PCI != "" && served[pci4(x.PCI)]) {
				continue
			}
			cand(x.UUID, pci4(x.PCI), "failed to enumerate: in the node's GPU list (gpu_metadata.json) but not seen by the driver")
		}
		for _, p := range s.PCIGPUs {
			if !served[pci4(p)] && len(s.GPUInfo) > 0 {
				cand("", pci4(p), "on the PCI bus but not served by the NVIDIA driver")
			}
		}
	}
	// NVSwitches.
	if s.PCISwitches != nil && s.NVSwitchCount >= 0 {
		unbound := s.unboundSwitches()
		sguide := "Manual Degradation: NVSwitch Exclusion (In-Band NVSwitch Exclusion)"
		if len(listed.NVSwitches) > 0 {
			for _, p := range unbound {
				cs = append(cs, cond{"switch-excluded|" + p, e.ev(s.Now, classNVSwitch, CheckSwitchExcl, "NVSWITCH-EXCLUDED", false, datamodels.RecommendedAction_NONE,
					fmt.Sprintf("NVSwitch %s is on the PCI bus but not used by the NVSwitch driver, with NvSwitchExcludelist set: excluded", p),
					[]*datamodels.Entity{switchEntity(p)}, map[string]string{"guide": sguide, "listed": strings.Join(listed.NVSwitches, ",")})})
			}
			if len(unbound) < len(listed.NVSwitches) {
				for _, u := range listed.NVSwitches[len(unbound):] {
					cs = append(cs, cond{"switch-listed|" + u, e.ev(s.Now, classNVSwitch, CheckSwitchExcl, "NVSWITCH-EXCLUDE-LISTED-NOT-PRESENT", false,
						datamodels.RecommendedAction_NONE, fmt.Sprintf("NVSwitch %s is in NvSwitchExcludelist but no NVSwitch is held back: it is not excluded", u),
						[]*datamodels.Entity{switchEntity(u)}, map[string]string{"guide": sguide, "unbound_nvswitches": strings.Join(unbound, ","),
							"recovery": "A listed NVSwitch that is not on the system (or whose PCIe enumeration failed) is not excluded, per the guide; update the list."})})
				}
			}
		}
	}
	return cs
}

func firstNonEmpty(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if strings.EqualFold(x, v) {
			return true
		}
	}
	return false
}

// --- nvswitch-audit reachability ---

func (e *Evaluator) auditConds(s *Snapshot) []cond {
	if e.platform.Name == PlatformB200 {
		return nil // nvswitch-audit is not supported on HGX B200 (FM guide)
	}
	a := s.Audit
	expected := map[int]int{} // physical id → links
	allowed := func(x, y int) bool { return true }
	parts := s.Partitions
	// In Shared NVSwitch and vGPU modes only the GPUs of an active
	// partition are routed to each other: the matrix's zeros between
	// partitions are normal. Without fmpm's partition list (fmpm missing
	// or failing) they cannot be told from missing routes, nor a route
	// from a breach: nothing is judged, nothing is lifted. Every
	// condition found while the partitions were known (missing, short
	// routes, breaches) stands until the next poll with them judges the
	// matrix again; fmpm failing once does not report a fault healthy.
	partitioned := e.mode() != ModeBareMetal
	if partitioned && parts == nil {
		var cs []cond
		for k := range e.bad {
			if key, ok := strings.CutPrefix(k, "audit|"); ok {
				cs = append(cs, e.standing("audit", key)...)
			}
		}
		return cs
	}
	if parts != nil {
		member := map[int][]int{} // physical id → active partitions
		for _, p := range parts.Partitions {
			if p.IsActive != 1 {
				continue
			}
			for _, g := range p.GPUs {
				member[g.PhysicalID] = append(member[g.PhysicalID], p.ID)
				if g.MaxNumNvLinks > 0 {
					expected[g.PhysicalID] = g.MaxNumNvLinks
				}
			}
		}
		allowed = func(x, y int) bool {
			for _, p := range member[x] {
				for _, q := range member[y] {
					if p == q {
						return true
					}
				}
			}
			return false
		}
	}
	def := e.platform.LinksPerGPU()
	if def == 0 && s.Topo != nil {
		def = s.Topo.MaxLinks()
	}
	var cs []cond
	guide := "Verifying GPU Routing (nvswitch-audit GPU Reachability Matrix)"
	for _, src := range a.GPUs {
		var missing, short, breach []string
		for _, dst := range a.GPUs {
			if src == dst {
				continue
			}
			n := a.Links[[2]int{src, dst}]
			want := expected[src]
			if want == 0 {
				want = def
			}
			if w := expected[dst]; w > 0 && w < want {
				want = w
			}
			switch ok := allowed(src, dst); {
			case !ok && n > 0:
				breach = append(breach, fmt.Sprintf("%d:%d", dst, n))
			case ok && n == 0 && want > 0:
				missing = append(missing, strconv.Itoa(dst))
			case ok && want > 0 && n < want:
				short = append(short, fmt.Sprintf("%d:%d/%d", dst, n, want))
			}
		}
		id, pci := physicalIDPrefix+strconv.Itoa(src), ""
		if e.platform.Name != PlatformA100 {
			if g := e.gpuByMod[src]; g != nil {
				id, pci = g.ID(), g.PCI
			}
		}
		ents := gpuEntities(id, pci)
		meta := map[string]string{"guide": guide, "gpu_physical_id": strconv.Itoa(src), "platform": e.platform.Name, "fabric_mode": e.mode()}
		h := e.cat.Handling["table17_config"]
		switch {
		case len(breach) > 0:
			meta["reachable_outside_partition"] = strings.Join(breach, ",")
			meta["recovery"] = "The NVSwitches route this GPU to GPUs of another partition: deactivate the partitions, restart FM, and verify again before starting guests."
			cs = append(cs, cond{"breach|" + id, e.ev(s.Now, classGPU, CheckReach, "NVSWITCH-ROUTING-ISOLATION-BREACH", true,
				datamodels.RecommendedAction_CONTACT_SUPPORT, fmt.Sprintf("GPU %d reaches GPUs outside its active partitions: %s", src, meta["reachable_outside_partition"]), ents, meta)})
		case len(missing) > 0:
			meta["unreachable_gpus"] = strings.Join(missing, ",")
			meta["recovery"] = "No NVSwitch route to GPUs it should reach: restart FM (service VM in Shared NVSwitch mode), then the host; check the FM log for the failing links."
			cs = append(cs, cond{"missing|" + id, e.ev(s.Now, classGPU, CheckReach, "NVSWITCH-ROUTING-UNREACHABLE", true, h.Action(e.mode()),
				fmt.Sprintf("GPU %d has no NVLink route to GPU(s) %s", src, meta["unreachable_gpus"]), ents, meta)})
		case len(short) > 0:
			meta["short_pairs"] = strings.Join(short, ",")
			meta["recovery"] = "Fewer NVLinks are routed than the platform has: a degraded link or NVSwitch (see the HA events); replace the part at maintenance."
			cs = append(cs, cond{"short|" + id, e.ev(s.Now, classGPU, CheckReach, "NVSWITCH-ROUTING-DEGRADED", false, datamodels.RecommendedAction_CONTACT_SUPPORT,
				fmt.Sprintf("GPU %d has fewer NVLinks routed than expected: %s (peer:links/expected)", src, meta["short_pairs"]), ents, meta)})
		}
	}
	return cs
}

// --- partitions (fmpm -l) ---

func (e *Evaluator) partitionConds(s *Snapshot) []cond {
	var cs []cond
	pl := s.Partitions
	guide := "Fabric Manager SDK (fmFabricPartitionList_t); GPU Partitions"
	for _, p := range pl.Partitions {
		if p.IsActive != 1 {
			continue
		}
		var short []string
		ents := []*datamodels.Entity{{EntityType: EntityPartition, EntityValue: strconv.Itoa(p.ID)}}
		for _, g := range p.GPUs {
			if g.NumNvLinksAvailable < g.MaxNumNvLinks {
				short = append(short, fmt.Sprintf("%d:%d/%d", g.PhysicalID, g.NumNvLinksAvailable, g.MaxNumNvLinks))
				id := firstNonEmpty(g.UUID, physicalIDPrefix+strconv.Itoa(g.PhysicalID))
				ents = append(ents, &datamodels.Entity{EntityType: events.EntityGPU, EntityValue: id})
			}
		}
		if len(short) == 0 {
			continue
		}
		cs = append(cs, cond{"degraded|" + strconv.Itoa(p.ID), e.ev(s.Now, classNVSwitch, CheckPartition, "FM-PARTITION-DEGRADED", false,
			datamodels.RecommendedAction_CONTACT_SUPPORT, fmt.Sprintf("active fabric partition %d runs with fewer NVLinks than its GPUs have: %s (physical id:available/max)",
				p.ID, strings.Join(short, ",")), ents, map[string]string{"guide": guide, "partition_id": strconv.Itoa(p.ID), "short_gpus": strings.Join(short, ","),
				"recovery": "The partition works at reduced bandwidth; the HA events name the failed link or NVSwitch."})})
	}
	if e.platform.Name == PlatformA100 && (e.config == nil || e.config.PartitionFile == "") && len(pl.Partitions) > 0 {
		bottom, top := false, false
		for _, p := range pl.Partitions {
			for _, g := range p.GPUs {
				if g.PhysicalID <= 8 {
					bottom = true
				} else {
					top = true
				}
			}
		}
		if e.platform.Baseboards() == 2 {
			bottom, top = true, true
		}
		have := map[int]bool{}
		for _, p := range pl.Partitions {
			have[p.ID] = true
		}
		var removed []int
		for id := range DefaultA100Partitions(bottom, top) {
			if !have[id] {
				removed = append(removed, id)
			}
		}
		sort.Ints(removed)
		if len(removed) > 0 {
			var ids []string
			for _, id := range removed {
				ids = append(ids, strconv.Itoa(id))
			}
			cs = append(cs, cond{"removed", e.ev(s.Now, classNVSwitch, CheckPartition, "FM-PARTITION-REMOVED", false,
				datamodels.RecommendedAction_CONTACT_SUPPORT, "FM removed default partitions from its supported list: "+strings.Join(ids, ","),
				e.nodeEntities(), map[string]string{"guide": "Default GPU Partitions (Table 14); High Availability modes remove the partitions of failed GPUs, links and NVSwitches",
					"removed_partitions": strings.Join(ids, ","), "recovery": "The remaining partitions work; the HA and exclusion events name the failed part."})})
		}
	}
	if pl.NumPartitions == 0 && (e.mode() == ModeShared || e.mode() == ModeVGPU) {
		cs = append(cs, cond{"none", e.ev(s.Now, classNVSwitch, CheckPartition, "FM-PARTITION-NONE", true, datamodels.RecommendedAction_CONTACT_SUPPORT,
			"FM reports no supported fabric partition: no guest VM can be started", e.nodeEntities(), map[string]string{"guide": guide})})
	}
	return cs
}

// --- NVSwitch telemetry (HGX B200) ---

// telemetry reports NVSwitch state from the telemetry counters: a port
// that is down or in error (state, with the GPU at its other end when
// known), a switch that needs a reset, a switch above its slowdown
// temperature, and increases of the error counters (occurrences).
func (e *Evaluator) telemetry(o *out, s *Snapshot) {
	var cs []cond
	guide := "NVSwitch Errors On DGX B200 and NVIDIA HGX B200 Systems (port and ASIC counters through NVSDM/DCGM)"
	for _, id := range s.Telemetry.SortedSwitches() {
		sw := s.Telemetry.Switches[id]
		sent := []*datamodels.Entity{switchEntity(id)}
		if sw.ResetRequired > 0 {
			cs = append(cs, cond{"reset|" + id, e.ev(s.Now, classNVSwitch, CheckTelemetry, "NVSWITCH-RESET-REQUIRED", true, datamodels.RecommendedAction_RESTART_BM,
				fmt.Sprintf("NVSwitch %s requires a reset", id), sent, map[string]string{"guide": guide,
					"recovery": "Reset the NVSwitches with the GPUs (a reset of the CX7 LPF resets its NVSwitch): restart the host."})})
		}
		if sw.TempC >= 0 && sw.SlowdownC > 0 && sw.TempC >= sw.SlowdownC {
			cs = append(cs, cond{"thermal|" + id, e.ev(s.Now, classNVSwitch, CheckTelemetry, "NVSWITCH-THERMAL-SLOWDOWN", false, datamodels.RecommendedAction_NONE,
				fmt.Sprintf("NVSwitch %s at %.0f C, at or above its slowdown temperature %.0f C", id, sw.TempC, sw.SlowdownC), sent,
				map[string]string{"guide": guide, "recovery": "Cooling might be insufficient; links may slow down."})})
		}
		var ports []int
		for p := range sw.Ports {
			ports = append(ports, p)
		}
		sort.Ints(ports)
		for _, p := range ports {
			ps := sw.Ports[p]
			ents := []*datamodels.Entity{switchEntity(id)}
			meta := map[string]string{"guide": guide, "port": strconv.Itoa(p)}
			if ps.RemotePCI != "" {
				meta["remote_pci"] = ps.RemotePCI
				if e.gpuPCIs[pci4(ps.RemotePCI)] || ps.Type == 5 {
					ents = append(ents, gpuEntities(e.gpuIDByPCI(ps.RemotePCI), kmsgPCI(ps.RemotePCI))...)
				}
			}
			wired := ps.Type > 0 || ps.RemotePCI != "" || e.platform.Name == PlatformB200
			if (ps.Status == 0 || ps.Status == 3) && wired {
				state := map[float64]string{0: "off", 3: "error"}[ps.Status]
				meta["link_status"] = state
				meta["recovery"] = "An NVSwitch port is down: reset the GPU on it (NVLink down: DCGM_FR_NVLINK_DOWN handling); if it stays down, replace the part."
				cs = append(cs, cond{"link|" + id + "/" + strconv.Itoa(p), e.ev(s.Now, classNVSwitch, CheckTelemetry, "NVSWITCH-LINK-DOWN", true,
					datamodels.RecommendedAction_COMPONENT_RESET, fmt.Sprintf("NVSwitch %s port %d is %s", id, p, state), ents, meta)})
			}
			for _, name := range []string{"fatal", "nonfatal", "replay", "recovery", "crc", "flit", "ecc"} {
				v, ok := ps.Counters[name]
				if !ok {
					continue
				}
				k := id + "/" + strconv.Itoa(p) + "/" + name
				prev, had := e.counter[k]
				e.counter[k] = v
				if !had || v <= prev {
					continue
				}
				m := clone(meta)
				m["counter"], m["delta"], m["value"] = name, strconv.FormatFloat(v-prev, 'f', -1, 64), strconv.FormatFloat(v, 'f', -1, 64)
				fatal, action := false, datamodels.RecommendedAction_NONE
				if name == "fatal" {
					fatal, action = true, datamodels.RecommendedAction_COMPONENT_RESET
				}
				o.add(e.ev(s.Now, classNVSwitch, CheckTelemetry, "NVSWITCH-LINK-"+strings.ToUpper(name)+"-ERRORS", fatal, action,
					fmt.Sprintf("NVSwitch %s port %d: %s errors +%s (now %s)", id, p, name, m["delta"], m["value"]), ents, m))
			}
		}
	}
	e.sync(o, "telem", cs, s.Now)
}

func (e *Evaluator) gpuIDByPCI(p string) string {
	for _, g := range e.gpuByUUID {
		if pci4(g.PCI) == pci4(p) {
			return g.ID()
		}
	}
	return kmsgPCI(p)
}
