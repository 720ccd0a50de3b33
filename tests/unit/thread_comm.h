// A Communicator over threads of one process, for tests of the parallel model code without
// processes or sockets: every collective is a rendezvous of the group's threads on shared slots.
#pragma once

#include <barrier>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "worker/comm.h"

namespace kt::test {

class ThreadGroup {
 public:
  explicit ThreadGroup(int size) : size_(size), barrier_(size), slots_(size) {}
  std::unique_ptr<worker::Communicator> member(int rank, std::string name = "tp");

 private:
  friend class ThreadCommunicator;
  int size_;
  std::barrier<> barrier_;
  std::vector<std::vector<float>> slots_;
  std::mutex mutex_;
  worker::CommStats stats_total_;
  // Point to point: messages in flight per (sender, receiver), in order; a send never blocks.
  std::condition_variable delivered_;
  std::map<std::pair<int, int>, std::deque<std::vector<float>>> mailboxes_;
};

class ThreadCommunicator : public worker::Communicator {
 public:
  ThreadCommunicator(ThreadGroup& group, int rank, std::string name)
      : group_(group), rank_(rank), name_(std::move(name)) {}
  int rank() const override { return rank_; }
  int size() const override { return group_.size_; }
  const std::string& name() const override { return name_; }

  std::shared_ptr<worker::CommWork> allreduce_async(float* data, size_t count,
                                                    worker::ReduceOp op) override {
    group_.slots_[rank_].assign(data, data + count);
    group_.barrier_.arrive_and_wait();
    for (size_t i = 0; i < count; ++i) {
      float acc = group_.slots_[0][i];
      for (int r = 1; r < group_.size_; ++r) {
        const float x = group_.slots_[r][i];
        acc = op == worker::ReduceOp::kSum ? acc + x : std::max(acc, x);
      }
      data[i] = acc;
    }
    group_.barrier_.arrive_and_wait();
    ++stats_.collectives;
    ++stats_.allreduces;
    stats_.bytes += static_cast<int64_t>(count * sizeof(float));
    return std::make_shared<worker::FinishedWork>();
  }
  void allgather(const float* in, float* out, size_t count) override {
    group_.slots_[rank_].assign(in, in + count);
    group_.barrier_.arrive_and_wait();
    for (int r = 0; r < group_.size_; ++r)
      std::memcpy(out + r * count, group_.slots_[r].data(), count * sizeof(float));
    group_.barrier_.arrive_and_wait();
    ++stats_.collectives;
  }
  void reduce_scatter(const float* in, float* out, size_t count) override {
    group_.slots_[rank_].assign(in, in + count * group_.size_);
    group_.barrier_.arrive_and_wait();
    for (size_t i = 0; i < count; ++i) {
      float acc = 0;
      for (int r = 0; r < group_.size_; ++r) acc += group_.slots_[r][rank_ * count + i];
      out[i] = acc;
    }
    group_.barrier_.arrive_and_wait();
    ++stats_.collectives;
  }
  void broadcast(float* data, size_t count, int root) override {
    if (rank_ == root) group_.slots_[root].assign(data, data + count);
    group_.barrier_.arrive_and_wait();
    if (rank_ != root) std::memcpy(data, group_.slots_[root].data(), count * sizeof(float));
    group_.barrier_.arrive_and_wait();
    ++stats_.collectives;
  }
  void barrier() override {
    group_.barrier_.arrive_and_wait();
    ++stats_.collectives;
  }
  std::shared_ptr<worker::CommWork> send_async(const float* data, size_t count, int peer) override {
    {
      std::lock_guard lock(group_.mutex_);
      group_.mailboxes_[{rank_, peer}].emplace_back(data, data + count);
    }
    group_.delivered_.notify_all();
    ++stats_.collectives;
    stats_.bytes += static_cast<int64_t>(count * sizeof(float));
    return std::make_shared<worker::FinishedWork>();
  }
  // The message is taken when the receiver waits for it.
  std::shared_ptr<worker::CommWork> recv_async(float* data, size_t count, int peer) override {
    ++stats_.collectives;
    stats_.bytes += static_cast<int64_t>(count * sizeof(float));
    struct Receive : worker::CommWork {
      ThreadGroup* group;
      float* data;
      size_t count;
      std::pair<int, int> key;
      bool done = false;
      void wait() override {
        if (done) return;
        done = true;
        std::unique_lock lock(group->mutex_);
        auto& box = group->mailboxes_[key];
        group->delivered_.wait(lock, [&] { return !box.empty(); });
        if (box.front().size() != count)
          throw Error("receive of " + std::to_string(count) + " floats got a message of " +
                      std::to_string(box.front().size()));
        std::memcpy(data, box.front().data(), count * sizeof(float));
        box.pop_front();
      }
    };
    auto work = std::make_shared<Receive>();
    work->group = &group_;
    work->data = data;
    work->count = count;
    work->key = {peer, rank_};
    return work;
  }
  worker::CommStats stats() const override { return stats_; }

 private:
  ThreadGroup& group_;
  int rank_;
  std::string name_;
  worker::CommStats stats_;
};

inline std::unique_ptr<worker::Communicator> ThreadGroup::member(int rank, std::string name) {
  return std::make_unique<ThreadCommunicator>(*this, rank, std::move(name));
}

}  // namespace kt::test
