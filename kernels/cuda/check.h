// Error checks for CUDA runtime and cuBLAS(Lt) calls: a failure throws kt::Error naming the call,
// file:line and the library's error string. Private to kernels/cuda and the CUDA device (it
// includes the CUDA headers).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "api/error.h"

namespace kt::kernels::cuda {

[[noreturn]] inline void throw_cuda_error(const char* what, const char* file, int line,
                                          const std::string& detail) {
  throw Error(std::string(file) + ":" + std::to_string(line) + ": " + what + " failed: " + detail);
}

inline void check_cuda(cudaError_t status, const char* what, const char* file, int line) {
  if (status != cudaSuccess)
    throw_cuda_error(what, file, line,
                     std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status));
}

inline void check_cublas(cublasStatus_t status, const char* what, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw_cuda_error(
        what, file, line,
        std::string(cublasLtGetStatusName(status)) + ": " + cublasLtGetStatusString(status));
}

}  // namespace kt::kernels::cuda

#define KT_CUDA_CHECK(call) ::kt::kernels::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define KT_CUBLAS_CHECK(call) ::kt::kernels::cuda::check_cublas((call), #call, __FILE__, __LINE__)
// After a kernel launch: launch-configuration errors surface here (execution errors at the next
// synchronising call).
#define KT_CUDA_CHECK_LAUNCH() KT_CUDA_CHECK(cudaGetLastError())
