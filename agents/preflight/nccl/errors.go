package nccl

import (
	"strings"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// Code names an NCCL failure as ADR-026's error table does.
type Code string

// The failure codes. The first five are ADR-026's table; the others are the
// rest of NCCL's result codes, the CUDA setup errors nccl-tests reports
// (cudaSetupErrors), and the corruption and bandwidth verdicts the checks
// add.
const (
	SystemError        Code = "NCCL_SYSTEM_ERROR"
	InternalError      Code = "NCCL_INTERNAL_ERROR"
	InvalidUsage       Code = "NCCL_INVALID_USAGE"
	Timeout            Code = "NCCL_TIMEOUT"
	RemoteError        Code = "NCCL_REMOTE_ERROR"
	InvalidArgument    Code = "NCCL_INVALID_ARGUMENT"
	UnhandledCudaError Code = "NCCL_UNHANDLED_CUDA_ERROR"
	CudaSetupError     Code = "NCCL_CUDA_SETUP_ERROR"
	DataCorruption     Code = "NCCL_DATA_CORRUPTION"
	BandwidthDegraded  Code = "NCCL_BW_DEGRADED"
)

// Verdict is what a failure code means for the node: its recommended action
// and whether it is fatal (a hardware fault) or not (configuration, timing).
type Verdict struct {
	Action datamodels.RecommendedAction
	Fatal  bool
}

// Verdicts is ADR-026's "NCCL Checks" table: SYSTEM, INTERNAL and REMOTE
// errors are hardware (fatal), INVALID_USAGE and TIMEOUT are not. Beyond
// the ADR: an invalid argument is configuration (not fatal); an unhandled
// CUDA error in a collective, and a CUDA runtime error nccl-tests reports
// ("Test CUDA failure") other than a setup error, is treated like an
// internal error (fatal, run DCGM EUD to find the part); a CUDA setup error
// (the check's image or the GPU's sharing, not the hardware:
// cudaSetupErrors) is not fatal; wrong data is corruption (fatal, contact
// support); a loopback bandwidth below threshold is degraded NVLink/PCIe
// (fatal, contact support). The gang-wide check reports low bandwidth,
// remote and system errors non-fatal (the checks package's gangVerdict):
// a peer causes them as much as the node that reports them.
var Verdicts = map[Code]Verdict{
	SystemError:        {datamodels.RecommendedAction_CONTACT_SUPPORT, true},
	InternalError:      {datamodels.RecommendedAction_RUN_DCGMEUD, true},
	InvalidUsage:       {datamodels.RecommendedAction_NONE, false},
	Timeout:            {datamodels.RecommendedAction_NONE, false},
	RemoteError:        {datamodels.RecommendedAction_CONTACT_SUPPORT, true},
	InvalidArgument:    {datamodels.RecommendedAction_NONE, false},
	UnhandledCudaError: {datamodels.RecommendedAction_RUN_DCGMEUD, true},
	CudaSetupError:     {datamodels.RecommendedAction_NONE, false},
	DataCorruption:     {datamodels.RecommendedAction_CONTACT_SUPPORT, true},
	BandwidthDegraded:  {datamodels.RecommendedAction_CONTACT_SUPPORT, true},
}

// Failure is one failure line of a log.
type Failure struct {
	Code Code
	// Text is the line (prefixes removed), as printed.
	Text string
	// Line is its 1-based line number.
	Line int
}

// patterns map what NCCL, nccl-tests and PyTorch print to codes. Each
// NCCL result has a C name (ncclSystemError, printed by PyTorch) and a
// string from ncclGetErrorString, whose wording changed between versions
// ("internal error" became "internal error - please report this issue to
// the NCCL developers"; newer versions append "(run with NCCL_DEBUG=INFO
// for details)"). Order matters: the first match wins.
var patterns = []struct {
	needle string
	code   Code
}{
	{"ncclSystemError", SystemError},
	{"ncclInternalError", InternalError},
	{"ncclRemoteError", RemoteError},
	{"ncclInvalidUsage", InvalidUsage},
	{"ncclInvalidArgument", InvalidArgument},
	{"ncclUnhandledCudaError", UnhandledCudaError},
	{"unhandled system error", SystemError},
	{"remote process exited or there was a network error", RemoteError},
	{"unhandled cuda error", UnhandledCudaError},
	{"'internal error", InternalError},
	{", internal error", InternalError},
	{"'invalid usage", InvalidUsage},
	{", invalid usage", InvalidUsage},
	{"'invalid argument", InvalidArgument},
	{", invalid argument", InvalidArgument},
	{testCUDAFailure, UnhandledCudaError}, // or CudaSetupError: cudaFailureCode
	{"Watchdog caught collective operation timeout", Timeout},
	{"collective operation timeout", Timeout},
	{"operation timeout", Timeout},
	{"before timing out", Timeout},
	{"NCCL timeout", Timeout},
}

// Classify names the NCCL failure a line reports, if any. Only lines that
// state a failure match (a "Test NCCL failure" line, a PyTorch NCCL error,
// a watchdog timeout), not INFO chatter that happens to mention an error
// name.
func Classify(line string) (Failure, bool) {
	if !failureLine(line) {
		return Failure{}, false
	}
	for _, p := range patterns {
		if strings.Contains(line, p.needle) {
			code := p.code
			if p.needle == testCUDAFailure {
				code = cudaFailureCode(line)
			}
			return Failure{Code: code, Text: strings.TrimSpace(line)}, true
		}
	}
	return Failure{}, false
}

// testCUDAFailure starts the line nccl-tests prints when a CUDA runtime
// call fails: "Test CUDA failure common.cu:1009 '<cudaGetErrorString>'".
const testCUDAFailure = "Test CUDA failure"

// cudaSetupErrors are CUDA runtime errors (cudaGetErrorString's wording,
// CUDA 12) that say the check could not run on the GPU, not that the GPU
// is bad: the image's CUDA runtime is newer than the node's driver or
// built for another architecture, another process holds the GPU's memory,
// the pod sees no GPU or fewer than it asked for.
var cudaSetupErrors = []string{
	"CUDA driver version is insufficient for CUDA runtime version", // cudaErrorInsufficientDriver
	"forward compatibility was attempted on non supported HW",      // cudaErrorCompatNotSupportedOnDevice
	"system has unsupported display driver / cuda driver combination",
	"CUDA driver is a stub library",
	"out of memory",                      // cudaErrorMemoryAllocation
	"no CUDA-capable device is detected", // cudaErrorNoDevice
	"invalid device ordinal",             // -g larger than the pod's GPUs
	"no kernel image is available for execution on the device",
	"device kernel image is invalid",
	"PTX", // unsupported toolchain, JIT compilation failed, JIT compiler not found
	"operation not supported",
}

// cudaFailureCode is what a "Test CUDA failure" line's error says: a setup
// error (cudaSetupErrors) is CudaSetupError; any other — an uncorrectable
// ECC error, an illegal address, an unspecified launch failure, "system
// not yet initialized" (Fabric Manager down), a hardware stop, and errors
// not listed — stays UnhandledCudaError, as before: a CUDA error in a
// check that ran on a known image is the GPU's until shown otherwise, and
// an error missed here cordons one node, while one wrongly excused lets a
// bad GPU take jobs.
func cudaFailureCode(line string) Code {
	l := strings.ToLower(line)
	for _, e := range cudaSetupErrors {
		if strings.Contains(l, strings.ToLower(e)) {
			return CudaSetupError
		}
	}
	return UnhandledCudaError
}

// failureLine is the cheap test that a line reports a failure at all.
func failureLine(line string) bool {
	return strings.Contains(line, "Test NCCL failure") ||
		strings.Contains(line, "Test CUDA failure") ||
		strings.Contains(line, "NCCL error") ||
		strings.Contains(line, "NCCL Error") ||
		strings.Contains(line, "ncclSystemError") ||
		strings.Contains(line, "ncclInternalError") ||
		strings.Contains(line, "ncclRemoteError") ||
		strings.Contains(line, "ncclInvalidUsage") ||
		strings.Contains(line, "ncclInvalidArgument") ||
		strings.Contains(line, "ncclUnhandledCudaError") ||
		strings.Contains(line, "collective operation timeout") ||
		strings.Contains(line, "Watchdog caught") ||
		(strings.Contains(line, "WorkNCCL(") && strings.Contains(line, "Timeout(ms)=")) ||
		strings.Contains(line, "NCCL timeout")
}

// Worst returns the failure that decides the node's fate: a fatal one
// before a non-fatal one, then the first printed. ok is false when there
// are none.
func Worst(fs []Failure) (Failure, bool) {
	return WorstBy(fs, func(c Code) Verdict { return Verdicts[c] })
}

// WorstBy is Worst with the verdicts of verdict instead of Verdicts.
func WorstBy(fs []Failure, verdict func(Code) Verdict) (Failure, bool) {
	var best Failure
	found := false
	for _, f := range fs {
		if !found || (verdict(f.Code).Fatal && !verdict(best.Code).Fatal) {
			best, found = f, true
		}
	}
	return best, found
}
