// The GPU tests, by file; gpu_tests.cpp's main runs them (its header says in which order and
// mode). Each check goes through check()/expect_close() of test_support.h.
#pragma once

#include <vector>

#include "kernels/cuda/ops.h"

namespace kt::gpu_test {

struct NamedTest {
  const char* name;
  void (*run)();
};

// kernel_tests.cpp: the CUDA device's allocators and streams, then every CUDA kernel against the
// float64 reference (kernels/reference.h).
void run_kernel_tests(const kernels::cuda::Context& ctx);

// model_tests.cpp: the CUDA model (worker/cuda_gpt.h) on one rank — against the float64
// reference, offload (optimizer, window), memorising a batch, recompute.
std::vector<NamedTest> model_tests();

// parallel_tests.cpp: the CUDA model on several ranks (threads of this process) — data, tensor,
// and data × tensor parallelism over the host collectives and, where usable, NCCL.
std::vector<NamedTest> parallel_tests();
// The NCCL reducer's plumbing on one GPU (a group of one).
void test_nccl_reducer_single_rank();

}  // namespace kt::gpu_test
