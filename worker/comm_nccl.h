// The NCCL backend of worker/comm.h for CUDA ranks (compiled when the CUDA path is on; it runs
// on GPUs, so CI builds it but cannot execute it — the device check will). Collectives run on
// the communicator's own CUDA stream; allreduce_async returns at once and wait() blocks on a
// CUDA event, so the Oases schedule overlaps NCCL with compute on the compute stream. Buffers
// are device pointers.
#pragma once

#include <gloo/rendezvous/store.h>

#include <memory>
#include <string>

#include "worker/comm.h"

namespace kt::worker {

// Rank 0 of the group creates the NCCL unique id and publishes it in `store` under `key`; the
// others read it there. `device` is the CUDA device of this rank. Throws kt::Error naming the
// CUDA/NCCL call and its error string.
std::unique_ptr<Communicator> make_nccl_communicator(gloo::rendezvous::Store& store,
                                                     const std::string& key,
                                                     const std::string& name, int rank, int size,
                                                     int device);

}  // namespace kt::worker
