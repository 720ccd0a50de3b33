// The rendezvous store and the Gloo communicator, with real ranks: each test forks one process
// per rank on localhost, the ranks meet at a fresh port, and every rank checks its results
// against values it computes on its own from the same seeded data. A child reports "ok" or what
// went wrong through a pipe; the parent asserts.
#include "worker/comm.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "api/error.h"
#include "tests/support/random.h"
#include "worker/rendezvous.h"

namespace kt {
namespace {

using worker::Communicator;
using worker::ProcessGroups;
using worker::ReduceOp;
using worker::RendezvousConfig;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A port nobody listens on right now (the kernel's choice for an ephemeral bind).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

RendezvousConfig config_for(int rank, int world, int port, double timeout_seconds = 10) {
  RendezvousConfig config;
  config.master_addr = "127.0.0.1";
  config.master_port = port;
  config.rank = rank;
  config.world_size = world;
  config.job_id = "test-" + std::to_string(port);
  config.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000));
  return config;
}

// Throws (in a child) so the message reaches the parent.
void require(bool condition, const std::string& what) {
  if (!condition) throw std::runtime_error(what);
}

struct ChildResult {
  int exit_code = -1;
  std::string report;  // "ok", an error message, or data the body chose to report
};

// Runs body(rank, report) in `world` forked processes. The body returns normally on success
// (having appended anything it wants to `report`) or throws; an exception's what() becomes
// the report with exit code 1. Any rank may also _exit() on its own (a "dead" rank).
std::vector<ChildResult> run_ranks(int world,
                                   const std::function<void(int rank, std::string& report)>& body) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  std::vector<int> pipes;
  for (int rank = 0; rank < world; ++rank) {
    int fds[2];
    if (::pipe(fds) != 0) std::abort();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      std::string report;
      int code = 0;
      try {
        body(rank, report);
        if (report.empty()) report = "ok";
      } catch (const std::exception& e) {
        report = e.what();
        code = 1;
      }
      ssize_t unused = ::write(fds[1], report.data(), report.size());
      (void)unused;
      ::close(fds[1]);
      ::_exit(code);  // no gtest teardown, no atexit handlers in the child
    }
    ::close(fds[1]);
    pids.push_back(pid);
    pipes.push_back(fds[0]);
  }
  std::vector<ChildResult> results(static_cast<size_t>(world));
  for (int rank = 0; rank < world; ++rank) {
    auto& result = results[static_cast<size_t>(rank)];
    char buffer[4096];
    ssize_t n;
    while ((n = ::read(pipes[static_cast<size_t>(rank)], buffer, sizeof(buffer))) > 0)
      result.report.append(buffer, static_cast<size_t>(n));
    ::close(pipes[static_cast<size_t>(rank)]);
    int status = 0;
    ::waitpid(pids[static_cast<size_t>(rank)], &status, 0);
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  return results;
}

void expect_all_ok(const std::vector<ChildResult>& results) {
  for (size_t rank = 0; rank < results.size(); ++rank) {
    EXPECT_EQ(results[rank].exit_code, 0) << "rank " << rank << ": " << results[rank].report;
    EXPECT_EQ(results[rank].report, "ok") << "rank " << rank;
  }
}

// The data rank `rank` contributes: uniform in [-1, 1), reproducible from (seed, rank).
std::vector<float> rank_data(uint32_t seed, int rank, size_t count) {
  std::mt19937 gen(seed * 7919u + static_cast<uint32_t>(rank));
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> data(count);
  for (auto& x : data) x = dist(gen);
  return data;
}

using test::fresh_seed;

void require_near(const std::vector<float>& got, const std::vector<double>& want, double tolerance,
                  const std::string& what) {
  require(got.size() == want.size(), what + ": size " + std::to_string(got.size()));
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::abs(got[i] - want[i]) > tolerance) {
      std::ostringstream out;
      out << what << ": element " << i << " is " << got[i] << ", want " << want[i];
      throw std::runtime_error(out.str());
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The store on its own

TEST(TcpStore, GetBlocksUntilAnotherClientSetsTheKey) {
  worker::TcpStoreServer server(0, "127.0.0.1");
  worker::TcpStore reader("127.0.0.1", server.port(), std::chrono::seconds(5));
  worker::TcpStore writer("127.0.0.1", server.port(), std::chrono::seconds(5));
  // `start` before the writer's thread: its 200 ms sleep then lies wholly inside `waited`.
  const auto start = Clock::now();
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    writer.set("job/key", {'\0', 'x', '\xff'});  // values are bytes, NUL included
  });
  const auto value = reader.get("job/key");
  const double waited = seconds_since(start);
  later.join();
  EXPECT_EQ(value, (std::vector<char>{'\0', 'x', '\xff'}));
  EXPECT_GE(waited, 0.15);
  EXPECT_NO_THROW(reader.wait({"job/key"}));
}

TEST(TcpStore, WaitTimesOutNamingTheMissingKeys) {
  worker::TcpStoreServer server(0, "127.0.0.1");
  worker::TcpStore store("127.0.0.1", server.port(), std::chrono::seconds(5));
  store.set("a", {'1'});
  const auto start = Clock::now();
  try {
    store.wait({"a", "b", "c"}, std::chrono::milliseconds(300));
    FAIL() << "wait returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("waiting for key(s) b, c"), std::string::npos) << e.what();
  }
  EXPECT_LT(seconds_since(start), 2.0);
}

TEST(TcpStore, AbortKeyEndsWaitsWithItsMessage) {
  worker::TcpStoreServer server(0, "127.0.0.1");
  worker::TcpStore store("127.0.0.1", server.port(), std::chrono::seconds(5));
  worker::TcpStore other("127.0.0.1", server.port(), std::chrono::seconds(5));
  store.set_abort_key("job/abort");
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const std::string why = "rank 1 is misconfigured";
    other.set("job/abort", {why.begin(), why.end()});
  });
  EXPECT_THROW(
      {
        try {
          store.wait({"never"});
        } catch (const Error& e) {
          EXPECT_STREQ(e.what(), "rank 1 is misconfigured");
          throw;
        }
      },
      Error);
  later.join();
}

TEST(TcpStore, NoServerGivesAClearErrorWithinTheTimeout) {
  const int port = free_port();
  const auto start = Clock::now();
  try {
    worker::TcpStore store("127.0.0.1", port, std::chrono::milliseconds(800));
    FAIL() << "connected to nothing";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(
        message.find("rendezvous: no store at 127.0.0.1:" + std::to_string(port) + " after 0.8s"),
        std::string::npos)
        << message;
    EXPECT_NE(message.find("is rank 0 running? is MASTER_ADDR right?"), std::string::npos);
  }
  const double took = seconds_since(start);
  EXPECT_GE(took, 0.5);
  EXPECT_LT(took, 2.0);
}

TEST(TcpStoreServer, PortInUseIsAClearError) {
  worker::TcpStoreServer first(0);
  try {
    worker::TcpStoreServer second(first.port());
    FAIL() << "listened twice";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "cannot listen on :" + std::to_string(first.port()) +
                                         " for the rendezvous: Address already in use");
  }
}

// ---------------------------------------------------------------------------------------------
// Configuration

class ScopedEnv {
 public:
  explicit ScopedEnv(std::vector<std::pair<std::string, std::string>> vars) {
    for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "KUBETRAIN_JOB_ID",
                             "KUBETRAIN_COMM_TIMEOUT_SECONDS"}) {
      ::unsetenv(name);
    }
    for (const auto& [name, value] : vars) ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() {
    for (const char* name : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "KUBETRAIN_JOB_ID",
                             "KUBETRAIN_COMM_TIMEOUT_SECONDS"}) {
      ::unsetenv(name);
    }
  }
};

std::string from_env_error() {
  try {
    RendezvousConfig::from_env();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(RendezvousConfig, FromEnvReadsTheLauncherVariables) {
  ScopedEnv env({{"RANK", "3"},
                 {"WORLD_SIZE", "4"},
                 {"MASTER_ADDR", "trainer-0.svc"},
                 {"MASTER_PORT", "29555"},
                 {"KUBETRAIN_JOB_ID", "ns-job-2"},
                 {"KUBETRAIN_COMM_TIMEOUT_SECONDS", "7"}});
  const auto config = RendezvousConfig::from_env();
  EXPECT_EQ(config.rank, 3);
  EXPECT_EQ(config.world_size, 4);
  EXPECT_EQ(config.master_addr, "trainer-0.svc");
  EXPECT_EQ(config.master_port, 29555);
  EXPECT_EQ(config.job_id, "ns-job-2");
  EXPECT_EQ(config.timeout, std::chrono::seconds(7));
}

TEST(RendezvousConfig, FromEnvWithoutRankOrWorldIsAStandaloneRank) {
  ScopedEnv env({});
  const auto config = RendezvousConfig::from_env();
  EXPECT_EQ(config.rank, 0);
  EXPECT_EQ(config.world_size, 1);
}

TEST(RendezvousConfig, FromEnvNamesTheBadVariable) {
  {
    ScopedEnv env({{"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}});
    EXPECT_EQ(from_env_error(), "RANK is not set");
  }
  {
    ScopedEnv env({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "1"}});
    EXPECT_EQ(from_env_error(), "RANK=2 is not a rank in 0..1 (WORLD_SIZE)");
  }
  {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "two"}});
    EXPECT_EQ(from_env_error(), "WORLD_SIZE=two is not a positive rank count");
  }
  {
    ScopedEnv env(
        {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a"}, {"MASTER_PORT", "80x"}});
    EXPECT_EQ(from_env_error(), "MASTER_PORT=80x is not a TCP port (1..65535)");
  }
  {
    ScopedEnv env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "29500"}});
    EXPECT_EQ(from_env_error(), "MASTER_ADDR is not set (rank 0's address)");
  }
}

// ---------------------------------------------------------------------------------------------
// Collectives

TEST(SingleRankCommunicator, EveryCollectiveIsTheIdentity) {
  auto comm = worker::make_single_rank_communicator("tp");
  std::vector<float> data{1, 2, 3}, out(3);
  comm->allreduce(data.data(), data.size());
  comm->allgather(data.data(), out.data(), 3);
  comm->broadcast(data.data(), 3, 0);
  comm->barrier();
  EXPECT_EQ(data, (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(out, data);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->name(), "tp");
  EXPECT_EQ(comm->stats().collectives, 4);
  EXPECT_EQ(comm->stats().allreduces, 1);
}

TEST(ProcessGroups, WorldOfOneNeedsNoStore) {
  auto groups = worker::connect_process_groups(config_for(0, 1, free_port()), 1, 1);
  EXPECT_EQ(groups.world->size(), 1);
  EXPECT_EQ(groups.tp->size(), 1);
  EXPECT_EQ(groups.dp->size(), 1);
}

class AllReduce : public ::testing::TestWithParam<int> {};

TEST_P(AllReduce, SumAndMaxMatchIndependentlyComputedValues) {
  const int world = GetParam();
  const int port = free_port();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const std::vector<size_t> sizes{0, 1, 7, 1000, 1 << 20};
  const auto results = run_ranks(world, [&](int rank, std::string&) {
    auto groups = worker::connect_process_groups(config_for(rank, world, port), 1, world);
    require(groups.world->rank() == rank && groups.world->size() == world, "world rank/size");
    require(groups.dp->rank() == rank && groups.dp->size() == world, "dp rank/size");
    require(groups.tp->size() == 1, "tp size");
    for (size_t count : sizes) {
      std::vector<double> want_sum(count, 0.0), want_max(count, -2.0);
      for (int r = 0; r < world; ++r) {
        const auto theirs = rank_data(seed + static_cast<uint32_t>(count), r, count);
        for (size_t i = 0; i < count; ++i) {
          want_sum[i] += theirs[i];
          want_max[i] = std::max(want_max[i], static_cast<double>(theirs[i]));
        }
      }
      auto sum = rank_data(seed + static_cast<uint32_t>(count), rank, count);
      auto max = sum;
      groups.world->allreduce(sum.data(), count, ReduceOp::kSum);
      groups.dp->allreduce(max.data(), count, ReduceOp::kMax);
      // |x| < 1 and ≤ 4 terms: float reassociation error stays far below 1e-5.
      require_near(sum, want_sum, 1e-5, "sum of " + std::to_string(count));
      require_near(max, want_max, 0, "max of " + std::to_string(count));
    }
  });
  expect_all_ok(results);
}

INSTANTIATE_TEST_SUITE_P(Ranks, AllReduce, ::testing::Values(2, 3, 4));

TEST(GlooCommunicator, AllgatherReduceScatterBroadcastAndBarrier) {
  const int world = 3, port = free_port();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const auto results = run_ranks(world, [&](int rank, std::string&) {
    auto groups = worker::connect_process_groups(config_for(rank, world, port), 1, world);
    Communicator& comm = *groups.world;
    const size_t count = 1001;

    // All-gather: rank r's block lands at r·count on every rank.
    const auto mine = rank_data(seed, rank, count);
    std::vector<float> gathered(count * world);
    comm.allgather(mine.data(), gathered.data(), count);
    for (int r = 0; r < world; ++r) {
      const auto theirs = rank_data(seed, r, count);
      require(std::equal(theirs.begin(), theirs.end(), gathered.begin() + r * count),
              "allgather block " + std::to_string(r));
    }

    // Reduce-scatter: this rank gets the sum of everybody's block `rank`.
    const auto full = rank_data(seed + 1, rank, count * world);
    std::vector<float> block(count);
    comm.reduce_scatter(full.data(), block.data(), count);
    std::vector<double> want(count, 0.0);
    for (int r = 0; r < world; ++r) {
      const auto theirs = rank_data(seed + 1, r, count * world);
      for (size_t i = 0; i < count; ++i) want[i] += theirs[rank * count + i];
    }
    require_near(block, want, 1e-5, "reduce_scatter");

    // Broadcast from every root in turn.
    for (int root = 0; root < world; ++root) {
      auto data = rank_data(seed + 2, rank, count);
      comm.broadcast(data.data(), count, root);
      const auto theirs = rank_data(seed + 2, root, count);
      require(data == theirs, "broadcast from " + std::to_string(root));
    }

    // Barrier: nobody leaves before the slowest rank (rank 2, 300 ms late) arrives. Each rank
    // compares when it left with when rank 2 arrived, which rank 2 broadcasts afterwards
    // (steady_clock is CLOCK_MONOTONIC, one clock for all processes), in 16-bit parts that a
    // float holds exactly.
    if (rank == world - 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const int64_t arrived = Clock::now().time_since_epoch().count();
    comm.barrier();
    const int64_t left = Clock::now().time_since_epoch().count();
    std::vector<float> parts(4);
    for (int i = 0; i < 4; ++i) parts[i] = static_cast<float>((arrived >> (16 * i)) & 0xffff);
    comm.broadcast(parts.data(), parts.size(), world - 1);
    int64_t last_arrived = 0;
    for (int i = 0; i < 4; ++i) last_arrived |= static_cast<int64_t>(parts[i]) << (16 * i);
    require(left >= last_arrived, "left the barrier before rank 2 arrived");
  });
  expect_all_ok(results);
}

TEST(ProcessGroups, TpTimesDpGroupsHaveTheRightMembers) {
  const int world = 4, tp = 2, dp = 2, port = free_port();
  const auto results = run_ranks(world, [&](int rank, std::string&) {
    auto groups = worker::connect_process_groups(config_for(rank, world, port), tp, dp);
    require(groups.tp->rank() == rank % tp && groups.tp->size() == tp, "tp rank/size");
    require(groups.dp->rank() == rank / tp && groups.dp->size() == dp, "dp rank/size");
    // TP groups are consecutive ranks {0,1} {2,3}; DP groups share rank % tp: {0,2} {1,3}.
    float in_tp = static_cast<float>(rank), in_dp = static_cast<float>(rank);
    float in_world = static_cast<float>(rank);
    // All three in flight at once: each group has its own context and thread.
    auto tp_work = groups.tp->allreduce_async(&in_tp, 1, ReduceOp::kSum);
    auto dp_work = groups.dp->allreduce_async(&in_dp, 1, ReduceOp::kSum);
    auto world_work = groups.world->allreduce_async(&in_world, 1, ReduceOp::kSum);
    world_work->wait();
    dp_work->wait();
    tp_work->wait();
    const int tp_first = rank / tp * tp;
    require(in_tp == static_cast<float>(2 * tp_first + 1), "tp sum " + std::to_string(in_tp));
    require(in_dp == static_cast<float>(2 * (rank % tp) + tp), "dp sum " + std::to_string(in_dp));
    require(in_world == 6.0f, "world sum " + std::to_string(in_world));
  });
  expect_all_ok(results);
}

TEST(GlooCommunicator, AsyncAllReducesCompleteInIssueOrderWhateverTheWaitOrder) {
  const int world = 2, port = free_port();
  const uint32_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const auto results = run_ranks(world, [&](int rank, std::string&) {
    auto groups = worker::connect_process_groups(config_for(rank, world, port), 2, 1);
    const int n = 6;
    const size_t count = 50000;
    std::vector<std::vector<float>> buffers;
    for (int k = 0; k < n; ++k) buffers.push_back(rank_data(seed + k, rank, count));
    std::vector<std::shared_ptr<worker::CommWork>> works;
    for (int k = 0; k < n; ++k) {
      works.push_back(groups.tp->allreduce_async(buffers[k].data(), count,
                                                 k % 2 ? ReduceOp::kMax : ReduceOp::kSum));
    }
    // Rank 0 waits newest first, rank 1 oldest first: results must not depend on it.
    for (int k = 0; k < n; ++k) works[rank == 0 ? n - 1 - k : k]->wait();
    for (int k = 0; k < n; ++k) {
      std::vector<double> want(count, k % 2 ? -2.0 : 0.0);
      for (int r = 0; r < world; ++r) {
        const auto theirs = rank_data(seed + k, r, count);
        for (size_t i = 0; i < count; ++i)
          want[i] = k % 2 ? std::max(want[i], static_cast<double>(theirs[i])) : want[i] + theirs[i];
      }
      require_near(buffers[k], want, 1e-6, "async op " + std::to_string(k));
    }
  });
  expect_all_ok(results);
}

TEST(GlooCommunicator, StatsCountOperationsBytesAndTime) {
  const int world = 2, port = free_port();
  const auto results = run_ranks(world, [&](int rank, std::string&) {
    auto groups = worker::connect_process_groups(config_for(rank, world, port), 2, 1);
    std::vector<float> data(1000, 1.0f), gathered(2000);
    groups.tp->allreduce(data.data(), 1000);
    groups.tp->allreduce_async(data.data(), 500, ReduceOp::kMax)->wait();
    groups.tp->allgather(data.data(), gathered.data(), 1000);
    groups.tp->broadcast(data.data(), 10, 0);
    groups.tp->barrier();
    const auto stats = groups.tp->stats();
    require(stats.collectives == 5, "collectives " + std::to_string(stats.collectives));
    require(stats.allreduces == 2, "allreduces " + std::to_string(stats.allreduces));
    // All-reduce: the buffer; all-gather: the gathered output; broadcast: the buffer.
    const int64_t want_bytes = 4 * (1000 + 500 + 2000 + 10);
    require(stats.bytes == want_bytes, "bytes " + std::to_string(stats.bytes));
    require(stats.seconds > 0, "seconds");
    require(stats.exposed_seconds > 0 && stats.exposed_seconds < 10, "exposed seconds");
    // The rendezvous itself is not counted, and the other groups saw nothing.
    require(groups.world->stats().collectives == 0, "world collectives");
    require(groups.dp->stats().collectives == 0, "dp collectives");
  });
  expect_all_ok(results);
}

// Prints the numbers the summary of this change quotes: connect time and a 4 MiB all-reduce.
TEST(GlooCommunicator, TimingOfConnectAndAFourMebibyteAllReduce) {
  const int world = 2, port = free_port();
  const auto results = run_ranks(world, [&](int rank, std::string& report) {
    const auto start = Clock::now();
    auto groups = worker::connect_process_groups(config_for(rank, world, port), 1, world);
    const double connect = seconds_since(start);
    std::vector<float> data(1 << 20, 1.0f);
    groups.world->allreduce(data.data(), data.size());  // warm-up
    const int reps = 10;
    const auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) groups.world->allreduce(data.data(), data.size());
    const double per_op = seconds_since(t0) / reps;
    char line[160];
    std::snprintf(line, sizeof(line), "connect %.1f ms, 4 MiB all-reduce %.2f ms (%.2f GB/s)",
                  connect * 1e3, per_op * 1e3, 4.0 * (1 << 20) / per_op / 1e9);
    report = line;
  });
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << results[r].report;
    std::printf("[ timing   ] rank %zu: %s\n", r, results[r].report.c_str());
  }
}

// ---------------------------------------------------------------------------------------------
// Failures

TEST(GlooCommunicator, AKilledPeerMakesTheSurvivorsFailWithinTheTimeout) {
  for (int world : {2, 3}) {
    const int port = free_port();
    const double timeout = 3;
    const auto results = run_ranks(world, [&](int rank, std::string& report) {
      auto groups =
          worker::connect_process_groups(config_for(rank, world, port, timeout), 1, world);
      std::vector<float> data(1 << 18, 1.0f);
      groups.world->allreduce(data.data(), data.size());
      if (rank == world - 1) {
        // Dies abruptly while the others are already inside the next all-reduce.
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        ::_exit(7);
      }
      const auto start = Clock::now();
      try {
        groups.world->allreduce(data.data(), data.size());
      } catch (const Error& e) {
        char took[32];
        std::snprintf(took, sizeof(took), "%.3f", seconds_since(start));
        report = std::string(took) + " " + e.what();
        // A later operation fails at once rather than waiting out another timeout.
        const auto again = Clock::now();
        try {
          groups.world->barrier();
        } catch (const Error&) {
          require(seconds_since(again) < 0.5, "second failure was slow");
          return;
        }
        throw std::runtime_error("barrier after the failure succeeded");
      }
      throw std::runtime_error("all-reduce with a dead peer succeeded");
    });
    EXPECT_EQ(results[static_cast<size_t>(world - 1)].exit_code, 7);
    for (int rank = 0; rank < world - 1; ++rank) {
      const auto& result = results[static_cast<size_t>(rank)];
      ASSERT_EQ(result.exit_code, 0)
          << "world " << world << " rank " << rank << ": " << result.report;
      const double took = std::stod(result.report);
      std::printf("[ dead peer] world %d rank %d failed after %.3f s: %s\n", world, rank, took,
                  result.report.substr(result.report.find(' ') + 1).c_str());
      EXPECT_LT(took, timeout + 2.0) << result.report;
      EXPECT_NE(result.report.find("world all-reduce failed: "), std::string::npos)
          << result.report;
    }
  }
}

TEST(GlooCommunicator, AHungPeerMakesTheOthersFailAfterTheTimeout) {
  const int world = 2, port = free_port();
  const double timeout = 1.5;
  const auto results = run_ranks(world, [&](int rank, std::string& report) {
    auto groups = worker::connect_process_groups(config_for(rank, world, port, timeout), 1, world);
    std::vector<float> data(1000, 1.0f);
    groups.world->allreduce(data.data(), data.size());
    if (rank == 1) {  // alive, connections open, but never joins the next collective
      std::this_thread::sleep_for(std::chrono::duration<double>(2 * timeout + 1));
      return;
    }
    const auto start = Clock::now();
    try {
      groups.world->allreduce(data.data(), data.size());
    } catch (const Error& e) {
      char took[32];
      std::snprintf(took, sizeof(took), "%.3f ", seconds_since(start));
      report = took + std::string(e.what());
      return;
    }
    throw std::runtime_error("all-reduce with a hung peer succeeded");
  });
  ASSERT_EQ(results[0].exit_code, 0) << results[0].report;
  const double took = std::stod(results[0].report);
  std::printf("[ hung peer] rank 0 failed after %.3f s: %s\n", took,
              results[0].report.substr(results[0].report.find(' ') + 1).c_str());
  EXPECT_GE(took, timeout - 0.1);
  EXPECT_LT(took, timeout + 1.0);
  EXPECT_NE(
      results[0].report.find("world all-reduce failed: no progress within the timeout of 1.5s"),
      std::string::npos)
      << results[0].report;
}

TEST(ProcessGroups, WrongMasterAddrIsAClearErrorWithinTheTimeout) {
  const int port = free_port();
  auto config = config_for(1, 2, port, 1.5);
  config.master_addr = "127.0.0.2";  // loopback, but nothing listens there
  const auto start = Clock::now();
  try {
    worker::connect_process_groups(config, 1, 2);
    FAIL() << "connected to nothing";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "rendezvous: no store at 127.0.0.2:" + std::to_string(port) + " after 1.5s"),
              std::string::npos)
        << e.what();
  }
  const double took = seconds_since(start);
  EXPECT_GE(took, 1.4);
  EXPECT_LT(took, 1.5 + 1.0);
}

TEST(ProcessGroups, PortInUseOnRankZeroIsAClearError) {
  worker::TcpStoreServer squatter(0);
  try {
    worker::connect_process_groups(config_for(0, 2, squatter.port()), 1, 2);
    FAIL() << "listened on a taken port";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "cannot listen on :" + std::to_string(squatter.port()) +
                                         " for the rendezvous: Address already in use");
  }
}

TEST(ProcessGroups, WorldSizeMismatchNamesBothSides) {
  const int port = free_port();
  const auto start = Clock::now();
  // Rank 0 believes in a world of 2, rank 1 in a world of 3.
  const auto results = run_ranks(2, [&](int rank, std::string&) {
    const int world = rank == 0 ? 2 : 3;
    worker::connect_process_groups(config_for(rank, world, port, 10), 1, world);
  });
  EXPECT_LT(seconds_since(start), 5.0) << "a mismatch must not wait for the timeout";
  EXPECT_EQ(results[0].exit_code, 1);
  EXPECT_EQ(results[0].report, "rendezvous: rank 1 says WORLD_SIZE=3, this rank says 2");
  EXPECT_EQ(results[1].exit_code, 1);
  EXPECT_EQ(results[1].report, "rendezvous: rank 1 says WORLD_SIZE=3, rank 0 says 2");
}

TEST(ProcessGroups, AMissingRankIsNamedAfterTheTimeout) {
  const int port = free_port();
  const auto results = run_ranks(2, [&](int rank, std::string&) {
    worker::connect_process_groups(config_for(rank, 3, port, 1.5), 1, 3);  // rank 2 never comes
  });
  for (const auto& result : results) {
    EXPECT_EQ(result.exit_code, 1);
    EXPECT_EQ(result.report, "rendezvous: rank(s) 2 of WORLD_SIZE=3 did not join at 127.0.0.1:" +
                                 std::to_string(port) +
                                 " within 1.5s (did they start? do they use the same "
                                 "MASTER_ADDR/MASTER_PORT?)");
  }
}

}  // namespace
}  // namespace kt
