#include "worker/memory_kind.h"

namespace kt::worker {

const char* to_string(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kParams:
      return "params";
    case MemoryKind::kGrads:
      return "grads";
    case MemoryKind::kOptimizer:
      return "optimizer";
    case MemoryKind::kActivations:
      return "activations";
    case MemoryKind::kWorkspace:
      return "workspace";
  }
  return "?";
}

}  // namespace kt::worker
