// The Gloo backend of comm.h (docs/WORKER.md, "Groups and collectives"): ranks meet at rank 0's TcpStoreServer, then each
// process group gets its own Gloo context over TCP and its own communication thread.
//
// Gloo facts this relies on (docs/ARCHITECTURE.md §8): a peer dying mid-collective raises SIGPIPE in
// the survivors unless it is ignored; after that a gloo::IoException is thrown within
// milliseconds, and a context that threw is unusable, so the group is marked broken and every
// later operation fails at once with the first error.
#include <arpa/inet.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>

#include "api/error.h"
#include "worker/comm.h"
#include "worker/device.h"
#include "worker/rendezvous.h"

namespace kt::worker {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string seconds_text(std::chrono::milliseconds ms) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%gs", ms.count() / 1000.0);
  return buffer;
}

// A group of one: every collective is the identity, but it still counts in the stats so that
// metrics look the same whatever the layout.
class SingleRankCommunicator : public Communicator {
 public:
  explicit SingleRankCommunicator(std::string name) : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }

  std::shared_ptr<CommWork> allreduce_async(float*, size_t count, ReduceOp) override {
    count_op(count, true);
    return std::make_shared<FinishedWork>();
  }
  void allgather(const float* in, float* out, size_t count) override {
    count_op(count, false);
    if (in != out) std::copy(in, in + count, out);
  }
  void reduce_scatter(const float* in, float* out, size_t count) override {
    count_op(count, false);
    if (in != out) std::copy(in, in + count, out);
  }
  void broadcast(float*, size_t count, int root) override {
    KT_CHECK(root == 0, "broadcast root " + std::to_string(root) + " in a group of one");
    count_op(count, false);
  }
  void barrier() override { count_op(0, false); }

  CommStats stats() const override {
    std::lock_guard lock(mutex_);
    return stats_;
  }

 private:
  void count_op(size_t floats, bool is_allreduce) {
    std::lock_guard lock(mutex_);
    ++stats_.collectives;
    if (is_allreduce) ++stats_.allreduces;
    stats_.bytes += static_cast<int64_t>(floats * sizeof(float));
  }

  std::string name_;
  mutable std::mutex mutex_;
  CommStats stats_;
};

// Turns Gloo's messages ("[./gloo/transport/tcp/pair.cc:598] Connection closed by peer
// [127.0.0.1]:63914") into what a user can act on, naming the group and the operation.
std::string describe_failure(const std::string& group, const std::string& op, std::string message,
                             std::chrono::milliseconds timeout) {
  if (!message.empty() && message[0] == '[') {
    const auto end = message.find("] ");
    if (end != std::string::npos) message.erase(0, end + 2);
  }
  const std::string prefix = group + " " + op + " failed: ";
  auto contains = [&](const char* text) { return message.find(text) != std::string::npos; };
  if (contains("Connection closed by peer")) {
    const std::string peer = message.substr(message.find("peer") + 4);
    return prefix + "connection closed by peer" + peer + " (a rank died?)";
  }
  if (contains("Connection reset by peer") || contains("Broken pipe")) {
    return prefix + "connection lost (" + message + "; a rank died?)";
  }
  if (contains("Timed out") || contains("timed out") || contains("Timeout")) {
    return prefix + "no progress within the timeout of " + seconds_text(timeout) +
           " (a rank died or hung?): " + message;
  }
  return prefix + message;
}

// What every communicator of a rank shares: the store (and on rank 0 its server, which must
// outlive the connections of the others) and the Gloo device.
struct Rendezvous {
  std::unique_ptr<TcpStoreServer> server;
  std::unique_ptr<TcpStore> store;
  std::shared_ptr<gloo::transport::Device> device;
};

class GlooWork : public CommWork {
 public:
  using ExposedSink = std::function<void(double)>;
  GlooWork(std::shared_future<void> done, ExposedSink sink)
      : done_(std::move(done)), sink_(std::move(sink)) {}
  void wait() override {
    const auto start = Clock::now();
    done_.wait();
    sink_(seconds_since(start));
    done_.get();  // rethrows the operation's kt::Error
  }

 private:
  std::shared_future<void> done_;
  ExposedSink sink_;
};

// CommStats.bytes counts the largest buffer of each operation: the all-reduced or broadcast
// buffer, the all-gather's output, the reduce-scatter's input.
class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(std::string name, std::shared_ptr<gloo::Context> context,
                   std::chrono::milliseconds timeout, std::shared_ptr<Rendezvous> rendezvous)
      : name_(std::move(name)),
        context_(std::move(context)),
        timeout_(timeout),
        rendezvous_(std::move(rendezvous)),
        thread_("comm-" + name_) {}

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }
  const std::string& name() const override { return name_; }

  std::shared_ptr<CommWork> allreduce_async(float* data, size_t count, ReduceOp op) override {
    auto done = submit("all-reduce", count * sizeof(float), true, [=, this](uint32_t tag) {
      if (count == 0) return;  // Gloo rejects empty buffers; every rank skips alike
      gloo::AllreduceOptions options(context_);
      options.setOutput(data, count);  // no input: in place
      using Reduce = void (*)(void*, const void*, const void*, size_t);
      options.setReduceFunction(op == ReduceOp::kSum ? static_cast<Reduce>(&gloo::sum<float>)
                                                     : static_cast<Reduce>(&gloo::max<float>));
      options.setTag(tag);
      gloo::allreduce(options);
    });
    return std::make_shared<GlooWork>(std::move(done), [this](double s) { add_exposed(s); });
  }

  void allgather(const float* in, float* out, size_t count) override {
    allgather_async(in, out, count)->wait();
  }
  std::shared_ptr<CommWork> allgather_async(const float* in, float* out, size_t count) override {
    const size_t total = count * static_cast<size_t>(size());
    auto done = submit("all-gather", total * sizeof(float), false, [=, this](uint32_t tag) {
      if (count == 0) return;
      gloo::AllgatherOptions options(context_);
      options.setInput(const_cast<float*>(in), count);  // Gloo only reads it
      options.setOutput(out, total);
      options.setTag(tag);
      gloo::allgather(options);
    });
    return std::make_shared<GlooWork>(std::move(done), [this](double s) { add_exposed(s); });
  }

  // All-reduce of a copy, then this rank's slice: Gloo's ReduceScatterHalvingDoubling uses the
  // old slot-based API with per-rank counts. This moves twice the bytes of a ring
  // reduce-scatter (the CPU workers' distributed optimizer pays it; docs/WORKER.md).
  void reduce_scatter(const float* in, float* out, size_t count) override {
    reduce_scatter_async(in, out, count)->wait();
  }
  std::shared_ptr<CommWork> reduce_scatter_async(const float* in, float* out,
                                                 size_t count) override {
    const size_t total = count * static_cast<size_t>(size());
    auto done = submit("reduce-scatter", total * sizeof(float), false, [=, this](uint32_t tag) {
      if (count == 0) return;
      std::vector<float> sum(in, in + total);
      gloo::AllreduceOptions options(context_);
      options.setOutput(sum.data(), total);
      options.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      options.setTag(tag);
      gloo::allreduce(options);
      const size_t offset = count * static_cast<size_t>(rank());
      std::copy(sum.begin() + offset, sum.begin() + offset + count, out);
    });
    return std::make_shared<GlooWork>(std::move(done), [this](double s) { add_exposed(s); });
  }

  void broadcast(float* data, size_t count, int root) override {
    KT_CHECK(root >= 0 && root < size(), "broadcast root " + std::to_string(root) +
                                             " outside group " + name_ + " of " +
                                             std::to_string(size()));
    run_sync("broadcast", count * sizeof(float), [=, this](uint32_t tag) {
      if (count == 0) return;
      gloo::BroadcastOptions options(context_);
      options.setOutput(data, count);  // the root's output is its input
      options.setRoot(root);
      options.setTag(tag);
      gloo::broadcast(options);
    });
  }

  void barrier() override {
    run_sync("barrier", 0, [this](uint32_t tag) {
      gloo::BarrierOptions options(context_);
      options.setTag(tag);
      gloo::barrier(options);
    });
  }

  // On the caller's thread: Gloo posts the unbound buffer to its device loop at once, so a send
  // does not wait for the receiver; wait() blocks for the transfer.
  std::shared_ptr<CommWork> send_async(const float* data, size_t count, int peer) override {
    return point_to_point(true, const_cast<float*>(data), count, peer);  // Gloo only reads it
  }
  std::shared_ptr<CommWork> recv_async(float* data, size_t count, int peer) override {
    return point_to_point(false, data, count, peer);
  }

  CommStats stats() const override {
    std::lock_guard lock(mutex_);
    return stats_;
  }

 private:
  // One slot for every point-to-point message (they match per peer and direction, in order),
  // far above the collectives' tags.
  static constexpr uint64_t kPointToPointSlot = uint64_t{1} << 40;

  class PointToPointWork : public CommWork {
   public:
    PointToPointWork(GlooCommunicator& group, bool send, int peer, size_t bytes,
                     std::unique_ptr<gloo::transport::UnboundBuffer> buffer)
        : group_(group), send_(send), peer_(peer), bytes_(bytes), buffer_(std::move(buffer)) {}
    ~PointToPointWork() override {
      try {
        wait();
      } catch (...) {  // reported to whoever waited first; a destructor must not throw
      }
    }
    void wait() override {
      if (done_) return;
      done_ = true;
      const auto start = Clock::now();
      std::string failure;
      try {
        const bool ok =
            send_ ? buffer_->waitSend(group_.timeout_) : buffer_->waitRecv(group_.timeout_);
        if (!ok) failure = "timed out";
      } catch (const gloo::EnforceNotMet& e) {
        failure = e.what();
      } catch (const std::exception& e) {
        failure = e.what();
      }
      // The transfer runs on Gloo's device thread: the wait is what the group knows of its time.
      const double waited = seconds_since(start);
      group_.add_exposed(waited);
      {
        std::lock_guard lock(group_.mutex_);
        group_.stats_.seconds += waited;
      }
      if (!failure.empty()) {
        const std::string what = std::string(send_ ? "send of " : "receive of ") +
                                 std::to_string(bytes_) + " bytes " + (send_ ? "to" : "from") +
                                 " rank " + std::to_string(peer_);
        throw Error(describe_failure(group_.name_, what, failure, group_.timeout_));
      }
    }

   private:
    GlooCommunicator& group_;
    bool send_;
    int peer_;
    size_t bytes_;
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer_;
    bool done_ = false;
  };

  std::shared_ptr<CommWork> point_to_point(bool send, float* data, size_t count, int peer) {
    KT_CHECK(peer >= 0 && peer < size() && peer != rank(),
             "point-to-point peer " + std::to_string(peer) + " in group " + name_ + " of " +
                 std::to_string(size()));
    const size_t bytes = count * sizeof(float);
    {
      std::lock_guard lock(mutex_);
      if (!broken_.empty())
        throw Error(name_ +
                    " point-to-point failed: the group is broken by an earlier error: " + broken_);
      ++stats_.collectives;
      stats_.bytes += static_cast<int64_t>(bytes);
    }
    if (count == 0) return std::make_shared<FinishedWork>();
    auto buffer = context_->createUnboundBuffer(data, bytes);
    if (send)
      buffer->send(peer, kPointToPointSlot);
    else
      buffer->recv(peer, kPointToPointSlot);
    return std::make_shared<PointToPointWork>(*this, send, peer, bytes, std::move(buffer));
  }

  // Queues `op` on the communication thread (issue order = execution order on every rank) and
  // returns its completion. The op gets a tag from the group's counter. Gloo's exceptions become
  // kt::Error here, on the thread that caught them.
  std::shared_future<void> submit(const std::string& what, size_t bytes, bool is_allreduce,
                                  std::function<void(uint32_t)> op) {
    auto promise = std::make_shared<std::promise<void>>();
    std::shared_future<void> done = promise->get_future().share();
    uint32_t tag = 0;
    {
      std::lock_guard lock(mutex_);
      tag = next_tag_++;
      ++stats_.collectives;
      if (is_allreduce) ++stats_.allreduces;
      stats_.bytes += static_cast<int64_t>(bytes);
    }
    thread_.enqueue([this, what, tag, promise, op = std::move(op)] {
      {
        std::lock_guard lock(mutex_);
        if (!broken_.empty()) {
          promise->set_exception(std::make_exception_ptr(
              Error(name_ + " " + what +
                    " failed: the group is broken by an earlier error: " + broken_)));
          return;
        }
      }
      const auto start = Clock::now();
      std::string failure;
      try {
        op(tag);
      } catch (const gloo::EnforceNotMet& e) {  // not a std::runtime_error
        failure = describe_failure(name_, what, e.what(), timeout_);
      } catch (const std::exception& e) {  // gloo::IoException and friends
        failure = describe_failure(name_, what, e.what(), timeout_);
      }
      {
        std::lock_guard lock(mutex_);
        stats_.seconds += seconds_since(start);
        if (!failure.empty() && broken_.empty()) broken_ = failure;
      }
      if (failure.empty()) {
        promise->set_value();
      } else {
        promise->set_exception(std::make_exception_ptr(Error(failure)));
      }
    });
    return done;
  }

  void run_sync(const std::string& what, size_t bytes, std::function<void(uint32_t)> op) {
    GlooWork(submit(what, bytes, false, std::move(op)), [this](double s) {
      add_exposed(s);
    }).wait();
  }

  void add_exposed(double seconds) {
    std::lock_guard lock(mutex_);
    stats_.exposed_seconds += seconds;
  }

  const std::string name_;
  const std::shared_ptr<gloo::Context> context_;
  const std::chrono::milliseconds timeout_;
  const std::shared_ptr<Rendezvous> rendezvous_;
  mutable std::mutex mutex_;
  CommStats stats_;
  uint32_t next_tag_ = 0;
  std::string broken_;  // the first failure; the context cannot be used after it
  // Last member: destroyed first, so queued operations finish while the rest is alive.
  Stream thread_;
};

// The local IPv4 address whose route reaches `host` (a connected UDP socket sends nothing), so
// Gloo listens on, and advertises, the interface the other ranks can reach. "" if unknown.
std::string local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return "";
  std::string address;
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof(local);
    char text[INET_ADDRSTRLEN] = {};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text)) != nullptr) {
      address = text;
    }
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  return address;
}

int64_t parse_int_env(const char* name, int64_t low, int64_t high, const char* what) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') throw Error(std::string(name) + " is not set");
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || value < low || value > high) {
    throw Error(std::string(name) + "=" + text + " is not " + what);
  }
  return value;
}

bool env_set(const char* name) {
  const char* text = std::getenv(name);
  return text != nullptr && *text != '\0';
}

// Connects one Gloo context over `store` (already prefixed for the group).
std::shared_ptr<gloo::Context> connect_group(const std::string& name, int rank, int size,
                                             gloo::rendezvous::Store& store,
                                             std::shared_ptr<gloo::transport::Device>& device,
                                             std::chrono::milliseconds timeout) {
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(timeout);
  try {
    context->connectFullMesh(store, device);
  } catch (const Error&) {
    throw;  // the store's own message (timeout naming keys, abort) is already clear
  } catch (const gloo::EnforceNotMet& e) {
    throw Error("rendezvous: connecting the " + name + " group failed: " + e.what());
  } catch (const std::exception& e) {
    throw Error("rendezvous: connecting the " + name + " group failed: " + e.what());
  }
  return context;
}

// Everything after the store exists: the world-size check, then one Gloo context per group.
ProcessGroups connect_groups(const RendezvousConfig& config, int tp, int dp, int pp, int cut_tp,
                             int cut_stage, const std::shared_ptr<Rendezvous>& shared) {
  const int world = config.world_size;
  ProcessGroups groups;
  const std::string& job = config.job_id;
  // Rank 0 reaches its own server over loopback: MASTER_ADDR may be a Service name that does not
  // resolve to this pod until it is ready.
  shared->store = std::make_unique<TcpStore>(config.rank == 0 ? "127.0.0.1" : config.master_addr,
                                             config.master_port, config.timeout);
  TcpStore& store = *shared->store;
  store.set_abort_key(job + "/abort");
  gloo::rendezvous::PrefixStore job_store(job, store);
  const std::string endpoint = config.master_addr + ":" + std::to_string(config.master_port);

  // Every rank states its world size and checks the others', so a misconfigured rank fails the
  // whole job with a message that names both sides instead of a timeout.
  const std::string mine = std::to_string(world);
  job_store.set("world_size/" + std::to_string(config.rank), {mine.begin(), mine.end()});
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back("world_size/" + std::to_string(r));
  try {
    job_store.wait(keys, config.timeout);
  } catch (const Error& e) {
    if (std::string(e.what()).find("timed out") == std::string::npos) throw;  // an abort
    std::string missing;
    for (int r = 0; r < world; ++r) {
      try {
        job_store.wait({keys[static_cast<size_t>(r)]}, std::chrono::milliseconds(1));
      } catch (const Error&) {
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
    }
    throw Error("rendezvous: rank(s) " + missing + " of WORLD_SIZE=" + mine + " did not join at " +
                endpoint + " within " + seconds_text(config.timeout) +
                " (did they start? do they use the same MASTER_ADDR/MASTER_PORT?)");
  }
  for (int r = 0; r < world; ++r) {
    const auto value = job_store.get(keys[static_cast<size_t>(r)]);
    const std::string theirs(value.begin(), value.end());
    if (theirs != mine) {
      const std::string both = "rank " + std::to_string(r) + " says WORLD_SIZE=" + theirs;
      const std::string abort =
          "rendezvous: " + both + ", rank " + std::to_string(config.rank) + " says " + mine;
      store.set(job + "/abort", {abort.begin(), abort.end()});
      throw Error("rendezvous: " + both + ", this rank says " + mine);
    }
  }

  gloo::transport::tcp::attr attr;
  attr.hostname = local_address_towards(config.master_addr, config.master_port);
  attr.ai_family = AF_INET;
  try {
    shared->device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw Error("cannot open a Gloo TCP device on '" + attr.hostname + "': " + e.what());
  }

  // One Gloo context per group of comm.h's layout, each under its key's prefix (in one fixed
  // order on every rank: each connect waits for the group's other members).
  const RankPlaces places = rank_places(config.rank, world, tp, dp, pp, cut_tp, cut_stage);
  const std::pair<const GroupPlace*, std::unique_ptr<Communicator>*> each[] = {
      {&places.world, &groups.world},
      {&places.tp, &groups.tp},
      {&places.dp, &groups.dp},
      {&places.pp, &groups.pp},
      {&places.embedding, &groups.embedding},
      {&places.tp2, &groups.tp2},
      {&places.dp2, &groups.dp2},
      {&places.cut, &groups.cut}};
  std::shared_ptr<gloo::Context> contexts[std::size(each)];
  for (size_t i = 0; i < std::size(each); ++i) {
    const GroupPlace& place = *each[i].first;
    if (place.size < 2) continue;
    gloo::rendezvous::PrefixStore group_store(place.key, job_store);
    contexts[i] = connect_group(place.name, place.rank, place.size, group_store, shared->device,
                                config.timeout);
  }
  // Nobody leaves before everybody is connected: after this no rank reads the store again, so
  // rank 0 may exit (taking the server down) without stranding a slower rank.
  try {
    gloo::BarrierOptions options(contexts[0]);  // the world's
    options.setTag(0xFFFFFFFFu);
    gloo::barrier(options);
  } catch (const std::exception& e) {
    throw Error(
        describe_failure("world", "barrier after the rendezvous", e.what(), config.timeout));
  }

  for (size_t i = 0; i < std::size(each); ++i) {
    const GroupPlace& place = *each[i].first;
    if (contexts[i])
      *each[i].second =
          std::make_unique<GlooCommunicator>(place.name, contexts[i], config.timeout, shared);
    else if (place.size == 1)
      *each[i].second = make_single_rank_communicator(place.name);
  }
  return groups;
}

}  // namespace

RankPlaces rank_places(int rank, int world, int tp, int dp, int pp, int cut_tp, int cut_stage) {
  KT_CHECK(
      tp >= 1 && dp >= 1 && pp >= 1 && int64_t{tp} * dp * pp == world && rank >= 0 && rank < world,
      "tp × dp × pp is the world, and the rank is in it");
  const int per_stage = tp * dp, stage = rank / per_stage, place = rank % per_stage;
  const bool stage_cut = cut_tp > 0 && pp > 1;
  KT_CHECK(!stage_cut || (cut_stage >= 1 && cut_stage < pp),
           "per-stage TP: the stages at cut_tp are some after the first");
  const int lo = std::min(tp, std::max(cut_tp, 1)), hi = std::max(tp, cut_tp);
  KT_CHECK(cut_tp == 0 || (per_stage % cut_tp == 0 && hi % lo == 0),
           "a cutpoint's TP degrees must divide the ranks that run them and nest");
  const std::string at = std::to_string(stage);
  auto key = [](std::initializer_list<int> parts) {
    std::string out;
    for (int part : parts) out += "/" + std::to_string(part);
    return out;
  };
  // The stage's own TP degree: the cut's where its stages run at cut_tp.
  const int t = stage_cut && stage >= cut_stage ? cut_tp : tp, d = per_stage / t;
  RankPlaces p;
  p.world = {"world", "world", rank, world};
  p.tp = {"tp", "tp" + key({stage, place / t}), place % t, t};
  p.dp = {"dp", "dp" + key({stage, place % t}), place / t, d};
  if (pp > 1) {
    p.pp = {"pp", "pp" + key({place}), stage, pp};
    // The tied embeddings' sum: the first and the last stage's rank at the place, or with
    // per-stage TP (two layouts of the unit) every rank of both stages.
    if (stage == 0 || stage == pp - 1)
      p.embedding =
          stage_cut ? GroupPlace{"embedding", "embedding", stage == 0 ? place : per_stage + place,
                                 2 * per_stage}
                    : GroupPlace{"embedding", "embedding" + key({place}), stage == 0 ? 0 : 1, 2};
  } else {
    p.pp = {"pp", "pp", 0, 1};
  }
  if (cut_tp == 0) return p;
  // The cut group: the ranks of one run of hi with the same place % lo, whose samples the wider
  // TP group joins — every rank with a cutpoint without stages; with per-stage TP, on the first
  // stage after the cut (the activations) and the last (the targets).
  const GroupPlace cut = {"cut", "cut" + key({stage, place / hi, place % lo}), (place % hi) / lo,
                          hi / lo};
  if (!stage_cut) {
    p.tp2 = {"tp2", "tp2" + key({rank / cut_tp}), rank % cut_tp, cut_tp};
    p.dp2 = {"dp2", "dp2" + key({rank % cut_tp}), rank / cut_tp, world / cut_tp};
    p.cut = cut;
  } else if (stage == cut_stage || stage == pp - 1) {
    p.cut = cut;
  }
  return p;
}

std::unique_ptr<Communicator> make_single_rank_communicator(const std::string& name) {
  return std::make_unique<SingleRankCommunicator>(name);
}

RendezvousConfig RendezvousConfig::from_env() {
  RendezvousConfig config;
  // Neither RANK nor WORLD_SIZE: a standalone run, rank 0 of 1. One without the other is a
  // launcher bug worth stopping for.
  if (!env_set("RANK") && !env_set("WORLD_SIZE")) return config;
  config.world_size =
      static_cast<int>(parse_int_env("WORLD_SIZE", 1, 1 << 20, "a positive rank count"));
  config.rank = static_cast<int>(parse_int_env(
      "RANK", 0, config.world_size - 1,
      ("a rank in 0.." + std::to_string(config.world_size - 1) + " (WORLD_SIZE)").c_str()));
  if (config.world_size > 1) {
    if (!env_set("MASTER_ADDR")) throw Error("MASTER_ADDR is not set (rank 0's address)");
    config.master_addr = std::getenv("MASTER_ADDR");
    config.master_port =
        static_cast<int>(parse_int_env("MASTER_PORT", 1, 65535, "a TCP port (1..65535)"));
  } else {
    if (env_set("MASTER_ADDR")) config.master_addr = std::getenv("MASTER_ADDR");
    if (env_set("MASTER_PORT")) {
      config.master_port =
          static_cast<int>(parse_int_env("MASTER_PORT", 1, 65535, "a TCP port (1..65535)"));
    }
  }
  if (env_set("KUBETRAIN_JOB_ID")) config.job_id = std::getenv("KUBETRAIN_JOB_ID");
  // Optional: tests and slow clusters shorten or lengthen every rendezvous and collective wait.
  if (env_set("KUBETRAIN_COMM_TIMEOUT_SECONDS")) {
    config.timeout = std::chrono::seconds(parse_int_env("KUBETRAIN_COMM_TIMEOUT_SECONDS", 1, 86400,
                                                        "a number of seconds (1..86400)"));
  }
  return config;
}

ProcessGroups connect_process_groups(const RendezvousConfig& config, int tp, int dp, int pp,
                                     int cut_tp, int cut_stage) {
  const int world = config.world_size;
  if (tp < 1 || dp < 1 || pp < 1 || int64_t{tp} * dp * pp != world) {
    throw Error("tp " + std::to_string(tp) + " × dp " + std::to_string(dp) + " × pp " +
                std::to_string(pp) + " does not equal WORLD_SIZE=" + std::to_string(world));
  }
  if (config.rank < 0 || config.rank >= world) {
    throw Error("RANK=" + std::to_string(config.rank) +
                " is outside WORLD_SIZE=" + std::to_string(world));
  }
  ProcessGroups groups;
  if (world == 1) {
    groups.world = make_single_rank_communicator("world");
    groups.tp = make_single_rank_communicator("tp");
    groups.dp = make_single_rank_communicator("dp");
    groups.pp = make_single_rank_communicator("pp");
    if (cut_tp > 0)
      for (auto [slot, name] : {std::pair{&groups.tp2, "tp2"}, {&groups.dp2, "dp2"},
                                {&groups.cut, "cut"}})
        *slot = make_single_rank_communicator(name);
    return groups;
  }
  const int per_stage = world / pp;
  if (cut_tp > 0 && (per_stage % cut_tp || std::max(tp, cut_tp) % std::min(tp, cut_tp) ||
                     (pp > 1 && (cut_stage < 1 || cut_stage >= pp))))
    throw Error(
        "a cutpoint at TP " + std::to_string(cut_tp) + " after TP " + std::to_string(tp) +
        " needs TP degrees that divide the " + std::to_string(per_stage) +
        " ranks that run them and each other" +
        (pp > 1 ? ", and a first stage after it among stages 1.." + std::to_string(pp - 1) : ""));
  // A peer that dies mid-send must give us an error, not kill this process (docs/ARCHITECTURE.md §8).
  std::signal(SIGPIPE, SIG_IGN);

  auto shared = std::make_shared<Rendezvous>();
  if (config.rank == 0) {
    // KUBETRAIN_LISTEN_ADDRESS: where listeners bind (a local pod: loopback; in a cluster, every
    // address, so that other pods reach rank 0).
    const char* listen = std::getenv("KUBETRAIN_LISTEN_ADDRESS");
    shared->server = std::make_unique<TcpStoreServer>(
        config.master_port, listen && *listen ? std::string(listen) : std::string("0.0.0.0"));
  }
  try {
    return connect_groups(config, tp, dp, pp, cut_tp, cut_stage, shared);
  } catch (const Error&) {
    // Rank 0 hosts the store: keep it up a moment so that the others read the reason (an abort
    // message, or their own timeout) instead of "lost the store".
    if (shared->server) std::this_thread::sleep_for(std::chrono::seconds(1));
    throw;
  }
}

}  // namespace kt::worker
