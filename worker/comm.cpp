// The backend-independent part of worker/comm.h: the group of one rank.
#include "worker/comm.h"

#include <cstring>

namespace kt::worker {
namespace {

class SingleRankCommunicator : public Communicator {
 public:
  explicit SingleRankCommunicator(std::string name) : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  std::shared_ptr<CommWork> allreduce_async(float*, size_t, ReduceOp) override {
    struct Done : CommWork {
      void wait() override {}
    };
    return std::make_shared<Done>();
  }
  void allgather(const float* in, float* out, size_t count) override {
    if (in != out) std::memmove(out, in, count * sizeof(float));
  }
  void reduce_scatter(const float* in, float* out, size_t count) override {
    if (in != out) std::memmove(out, in, count * sizeof(float));
  }
  void broadcast(float*, size_t, int) override {}
  void barrier() override {}
  CommStats stats() const override { return {}; }

 private:
  std::string name_;
};

}  // namespace

std::unique_ptr<Communicator> make_single_rank_communicator(const std::string& name) {
  return std::make_unique<SingleRankCommunicator>(name);
}

}  // namespace kt::worker
