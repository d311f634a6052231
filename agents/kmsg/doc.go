// Package kmsg is the node agent's kernel-log check: NVIDIA GPU Xid errors,
// NVSwitch SXid errors, GPUs fallen off the bus, and mlx5 NIC driver errors,
// read from /dev/kmsg, the systemd journal or a file, and reported as
// HealthEvents.
//
// # Event conventions
//
// Every event has agent "faultline-agent" and metadata "count" (how many
// occurrences it stands for, "1" except for flood summaries) and
// "kernel_message" (the line). Error codes are always prefixed:
//
//	what                     componentClass checkName              errorCode               entitiesImpacted
//	GPU Xid N                GPU            SysLogsXIDError        XID-N                   PCI=dddd:bb:dd, GPU=<uuid> when known
//	NVSwitch SXid N          NVSwitch       SysLogsSXIDError       SXID-N                  NVSwitch=<switch PCI>, GPU=<uuid> of the link when known
//	fallen off, no Xid 79    GPU            SysLogsGPUFallenOff    GPU-FALLEN-OFF-BUS      PCI, GPU when known
//	mlx5 driver error        NIC            SysLogsNICDriverError  MLX5-CMD-TIMEOUT, …     NIC=<mlx5_N|netdev|PCI>, PCI
//
// An Xid's recommendedAction is its catalog row's immediate resolution bucket
// (xid_catalog.json, transcribed from NVIDIA's Xid catalog), unknown codes
// CONTACT_SUPPORT; isFatal is recommendedAction != NONE, as in NVSentinel's
// syslog-health-monitor. An SXid's isFatal is the line's own Fatal/Non-fatal
// word; its action comes from the Fabric Manager guide's tables
// (sxid_catalog.json). A GPU fallen off the bus is fatal, RESTART_BM.
//
// # Occurrences, duplicates and floods
//
// The correlation processor counts Xids per GPU over windows, so every real
// occurrence is in some event's count. A line is one occurrence: the same
// line twice in what one parser reads (captures of one log concatenated
// for "kmsg parse", a log holding a message twice) is recognised by its
// body and printk timestamp — its wall-clock time only when it has none
// and is printed to a fraction of a second: a line in whole seconds
// (syslog, dmesg -T) is never a duplicate, real repeats in one second
// being common (Xid storms) — and reported once;
// and an event of a line with a known time has an id of the boot the
// line was logged in and the event (Check.occurrenceIDs), so the lines a
// restart reads again before the read position was saved — after a reboot
// too, a journal or file source resuming in the boot before — are the same
// events downstream, not new occurrences. A line whose time has whole
// seconds carries what tells its repeats in that second apart, the same
// when read again: its printk timestamp (metadata "kernel_timestamp") or,
// a file's line with none, the offset in the file where it ends
// ("file_offset"). A flood summary carries "first_seen" and "last_seen"
// (a line's time known), for one occurrence too. A journal line's event carries
// its boot as metadata "boot_id". A flood — one error code on one device
// repeating — is rate-limited: the first occurrence in a window
// (FloodWindow, default 10s) is reported at once; later ones are counted
// and closed by one event with metadata count=N and flood=true per window
// while the flood lasts. Where the line itself says how bad it is (an
// SXid's Fatal/Non-fatal, Xid 144-150's Fatal/Nonfatal, Xid 154's new
// recovery action), lines that say different things are different errors:
// a fatal one is never folded into a non-fatal one's summary. Summing
// metadata "count" gives the exact number of occurrences, across a restart
// too: what open windows hold is saved with the read position
// (Check.saveHeld).
//
// Multi-line messages are grouped: an SXid header line with its
// "Severity…"/"Data {…}" detail lines is one event (metadata "details");
// "The NVIDIA GPU <bdf> / (PCI ID…) installed in this system has / fallen off
// the bus…" is one fallen-off event. "caused by previous Xid N" never makes
// an event for N: only the code of an "Xid (PCI:…): N" line counts.
package kmsg
