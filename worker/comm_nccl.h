// The NCCL backend for CUDA ranks (docs/WORKER.md), compiled when the CUDA path is on. CI builds it
// but cannot run it; the device check runs it. libnccl is loaded at run time (dlopen of
// $KUBETRAIN_NCCL_LIBRARY, else libnccl.so.2), so a worker without NCCL on its machine still
// trains on one GPU and its data-parallel ranks fall back to the host reducer.
//
// As a Communicator, collectives run on the group's own CUDA stream, allreduce_async returns at
// once and wait() blocks on a CUDA event; as a GradientReducer, reductions wait for the compute
// stream's event and the stream that needs the sums waits for theirs, so the host never blocks;
// as StreamCollectives (tensor parallelism), all-reduces run on the caller's stream between
// events.
// Buffers are device pointers of `device`. NCCL needs one GPU per rank: two ranks of a group on
// one device fail at ncclCommInitRank.
#pragma once

#include <memory>
#include <string>

#include "worker/comm.h"
#include "worker/gradient_reducer.h"

namespace kt::worker {

// Whether libnccl can be loaded here; when not, `why` says what dlopen said.
bool nccl_available(std::string* why = nullptr);

// A group with the members of `bootstrap` (rank 0 creates the NCCL id and broadcasts it over
// `bootstrap`); every member must call this together. Throws kt::Error naming the CUDA/NCCL call
// and its error string (or why libnccl could not be loaded).
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device);
// `serialize_on`: issue the gradient sums on that stream (the TP communication stream) rather
// than the group's own, so that they never run concurrently with another communicator's
// operations: NCCL does not guarantee progress for concurrent operations of two communicators
// (its guide, "Using multiple NCCL communicators concurrently"). The trainer does this when TP
// also uses NCCL; the sums then delay the TP all-reduces issued after them.
std::unique_ptr<GradientReducer> make_nccl_gradient_reducer(Communicator& bootstrap, int device,
                                                            CudaStream* serialize_on = nullptr);
std::unique_ptr<StreamCollectives> make_nccl_stream_collectives(Communicator& bootstrap,
                                                                int device);
std::unique_ptr<StreamPointToPoint> make_nccl_point_to_point(Communicator& bootstrap, int device);

}  // namespace kt::worker
