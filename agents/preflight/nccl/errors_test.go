package nccl

import (
	"testing"

	"github.com/faultline/faultline/schemas/gen/datamodels"
)

// TestCUDAFailureVerdict: a "Test CUDA failure" line is fatal only when
// its CUDA error can be the GPU's. Before, every one was
// NCCL_UNHANDLED_CUDA_ERROR (fatal, RUN_DCGMEUD): a check image whose CUDA
// runtime is newer than the node's driver cordoned every healthy node it
// ran on. Lines marked published are copied from posts (the first from
// testdata/cuda-driver-insufficient.log); the others put
// cudaGetErrorString's wording in nccl-tests' format.
func TestCUDAFailureVerdict(t *testing.T) {
	for _, tc := range []struct {
		line string
		want Code
	}{
		// Published (NVIDIA/nccl-tests#98).
		{" Test CUDA failure common.cu:1045 'CUDA driver version is insufficient for CUDA runtime version'", CudaSetupError},
		{"Test CUDA failure common.cu:1009 'CUDA driver version is insufficient for CUDA runtime version'", CudaSetupError},
		{"Test CUDA failure common.cu:1009 'forward compatibility was attempted on non supported HW'", CudaSetupError},
		{"Test CUDA failure common.cu:1009 'system has unsupported display driver / cuda driver combination'", CudaSetupError},
		{"Test CUDA failure common.cu:1009 'CUDA driver is a stub library'", CudaSetupError},
		{"Test CUDA failure common.cu:422 'out of memory'", CudaSetupError},
		{"Test CUDA failure common.cu:1009 'no CUDA-capable device is detected'", CudaSetupError},
		{"Test CUDA failure common.cu:1009 'invalid device ordinal'", CudaSetupError},
		// Published (an NCCL build for sm_90 without PTX).
		{"Test CUDA failure common.cu:262 'no kernel image is available for execution on the device'", CudaSetupError},
		{"Test CUDA failure common.cu:262 'the provided PTX was compiled with an unsupported toolchain.'", CudaSetupError},
		{"Test CUDA failure common.cu:262 'a PTX JIT compilation failed'", CudaSetupError},
		{"Test CUDA failure common.cu:262 'device kernel image is invalid'", CudaSetupError},
		{"Test CUDA failure common.cu:1009 'operation not supported'", CudaSetupError},
		// The GPU's: published lines.
		{"qh138: Test CUDA failure common.cu:422 'uncorrectable ECC error encountered'", UnhandledCudaError},
		{"node: Test CUDA failure common.cu:297 'an illegal memory access was encountered'", UnhandledCudaError},
		{"Test CUDA failure common.cu:154 'unspecified launch failure'", UnhandledCudaError},
		{"test: Test CUDA failure common.cu:941 'system not yet initialized'", UnhandledCudaError},
		{"Test CUDA failure common.cu:154 'uncorrectable NVLink error detected during the execution'", UnhandledCudaError},
		{"Test CUDA failure common.cu:154 'hardware stack error'", UnhandledCudaError},
		// Not listed: as before.
		{"Test CUDA failure common.cu:1333 'CUDA-capable device(s) is/are busy or unavailable'", UnhandledCudaError},
		{"Test CUDA failure common.cu:154 'an error no CUDA version prints'", UnhandledCudaError},
	} {
		f, ok := Classify(tc.line)
		if !ok || f.Code != tc.want {
			t.Errorf("Classify(%q) = %v (%v), want %s", tc.line, f.Code, ok, tc.want)
			continue
		}
		v := Verdicts[f.Code]
		if tc.want == CudaSetupError && (v.Fatal || v.Action != datamodels.RecommendedAction_NONE) {
			t.Errorf("%q: verdict %+v, want non-fatal NONE", tc.line, v)
		}
		if tc.want == UnhandledCudaError && !v.Fatal {
			t.Errorf("%q: verdict %+v, want fatal", tc.line, v)
		}
	}
}
