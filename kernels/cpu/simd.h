// Runtime dispatch for the hot loops: GCC compiles each marked function for AVX-512, AVX2 and
// plain x86-64 and picks one by the CPU's features at load time, so one binary runs everywhere
// and uses AVX-512 where it exists.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KT_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KT_SIMD_CLONES
#endif
