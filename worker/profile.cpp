#include "worker/profile.h"

#include <netinet/in.h>
#include <omp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "api/error.h"
#include "api/flops.h"
#include "api/model.h"
#include "api/training_job.h"
#include "kernels/ops.h"
#include "worker/comm.h"
#include "worker/gpt.h"
#include "worker/offload.h"

namespace kt::worker {
namespace {

namespace k = kernels::cpu;
using profiling::median_seconds;
using profiling::random_floats;
using profiling::say;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The model's GEMMs of one micro-batch, forward and backward: (rows, in, out) per product.
struct Gemm {
  int64_t C, OC;
};
std::vector<Gemm> model_gemms(const api::ModelDims& m) {
  const int64_t C = m.hidden, F = m.ffn_hidden;
  return {{C, 3 * C}, {C, C}, {C, F}, {F, C}, {C, m.padded_vocab()}};
}

struct GemmBuffers {
  std::vector<float> inp, weight, out, dinp, dweight, dbias;
  std::vector<uint16_t> weight16;  // the weight in bf16 (bf16 runs)
};

// Inputs and weights (random, seeded) and outputs and gradients for each of `gemms` at `rows`.
std::vector<GemmBuffers> gemm_buffers(int64_t rows, const std::vector<Gemm>& gemms, uint32_t seed) {
  std::vector<GemmBuffers> out(gemms.size());
  for (size_t i = 0; i < gemms.size(); ++i) {
    const auto [in, o] = gemms[i];
    out[i] = {random_floats(rows * in, seed),
              random_floats(o * in, seed + 1),
              std::vector<float>(static_cast<size_t>(rows * o)),
              std::vector<float>(static_cast<size_t>(rows * in)),
              std::vector<float>(static_cast<size_t>(o * in)),
              std::vector<float>(static_cast<size_t>(o)),
              {}};
  }
  return out;
}

// One forward and backward of every GEMM, in fp32 or bf16 (the worker's kernels); returns its
// FLOPs.
double run_gemms(int64_t BT, const std::vector<Gemm>& gemms, std::vector<GemmBuffers>& buffers,
                 bool bf16 = false) {
  double flops = 0;
  for (size_t i = 0; i < gemms.size(); ++i) {
    const auto [C, OC] = gemms[i];
    GemmBuffers& b = buffers[i];
    if (bf16) {
      k::matmul_forward_bf16(b.out.data(), b.inp.data(), b.weight16.data(), nullptr, BT, C, OC);
      k::matmul_backward_bf16(b.dinp.data(), b.dweight.data(), b.dbias.data(), b.out.data(),
                              b.inp.data(), b.weight16.data(), BT, C, OC, false);
    } else {
      k::matmul_forward(b.out.data(), b.inp.data(), b.weight.data(), nullptr, BT, C, OC);
      k::matmul_backward(b.dinp.data(), b.dweight.data(), b.dbias.data(), b.out.data(),
                         b.inp.data(), b.weight.data(), BT, C, OC, false);
    }
    flops += 6.0 * static_cast<double>(BT) * static_cast<double>(C) * static_cast<double>(OC);
  }
  return flops;
}

// The model in `precision` with `recompute`, to time its micro-batches (forward and backward).
// Every one measured starts from the same weights, `weights`: the first draws GPT-2's
// initialisation into it (one thread, seconds for GPT-2 124M), the others copy it.
class TimedModel {
 public:
  TimedModel(const api::ModelDims& m, int64_t B, int64_t T, std::vector<float>& weights,
             api::Precision precision, api::Recompute recompute = api::Recompute::kNone)
      : model_(GptConfig::from(m), B, T, Device::cpu(), {}, 1, recompute, precision),
        tokens_(static_cast<size_t>(B * T + 1)) {
    const size_t n = static_cast<size_t>(model_.num_parameters());
    if (weights.empty()) {
      model_.init_weights(1);
      weights.assign(model_.params(), model_.params() + n);
    } else {
      KT_CHECK(weights.size() == n, "the profile's models differ in size");
      std::copy(weights.begin(), weights.end(), model_.params());
    }
    std::mt19937 rng(3);
    for (auto& t : tokens_) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(m.vocab));
  }
  // Median seconds of one micro-batch.
  double seconds(int reps) {
    return median_seconds(reps, [&] {
      model_.zero_grad();
      model_.train_micro_step(tokens_.data(), tokens_.data() + 1, 1.0f);
    });
  }

 private:
  Gpt model_;
  std::vector<int32_t> tokens_;
};

double device_bytes_in_use() {
  double total = 0;
  for (const auto& [kind, bytes] : Device::cpu()->bytes_in_use())
    total += static_cast<double>(bytes);
  return total;
}

// 6. Two ranks at work, as a plan's two ranks of a node are: both processes compute with half
//    the threads and all-reduce between or beside their compute. All-reduces between idle
//    processes (step 5) are not what a TP 2 or DP 2 run gets: there the peer is late by its own
//    compute's jitter, and Gloo's threads wait for a core the GEMMs hold (measured on a 2-core
//    machine: TP 2's all-reduces 4x, DP 2's 12x the idle prediction). Both ranks run:
//    the TP pattern: the forward and backward GEMMs of a layer at TP 2 shapes, a blocking
//      all-reduce of the activations (rows x C floats) after each row-parallel product;
//    the DP pattern: each layer's backward GEMMs, then that layer's gradient bucket all-reduced
//      asynchronously beside the next layer's (the worker's per-unit buckets).
struct RanksAtWork {
  double tp_allreduce_seconds = 0;  // median of the TP pattern's mean per all-reduce
  double dp_step_comm_seconds = 0;  // median comm thread seconds of the DP pattern's step
  double dp_step_bytes = 0;         // what it all-reduced
  int dp_step_allreduces = 0;       // in how many all-reduces
};

RanksAtWork ranks_at_work(Communicator& group, int64_t rows, const api::ModelDims& m, int reps) {
  const int64_t C = m.hidden, F = m.ffn_hidden;
  // TP 2 shards: qkv and fc column-parallel (out/2), the projection and fc2 row-parallel (in/2).
  const std::vector<Gemm> shards = {{C, 3 * C / 2}, {C / 2, C}, {C, F / 2}, {F / 2, C}};
  std::vector<GemmBuffers> b = gemm_buffers(rows, shards, 11);
  std::vector<float> act(static_cast<size_t>(rows * C), 0.0f);
  const int64_t layers = std::clamp<int64_t>(m.layers, 1, 4);
  auto fwd = [&](size_t i) {
    k::matmul_forward(b[i].out.data(), b[i].inp.data(), b[i].weight.data(), nullptr, rows,
                      shards[i].C, shards[i].OC);
  };
  auto bwd = [&](size_t i) {
    k::matmul_backward(b[i].dinp.data(), b[i].dweight.data(), b[i].dbias.data(), b[i].out.data(),
                       b[i].inp.data(), b[i].weight.data(), rows, shards[i].C, shards[i].OC, false);
  };
  double in_allreduce = 0;
  int64_t allreduces = 0;
  auto allreduce = [&] {
    const auto t0 = Clock::now();
    group.allreduce(act.data(), act.size());
    in_allreduce += seconds_since(t0);
    ++allreduces;
  };
  std::vector<double> per_rep;
  for (int r = 0; r <= reps; ++r) {  // the first is a warm-up
    in_allreduce = 0;
    allreduces = 0;
    for (int64_t l = 0; l < layers; ++l) {
      fwd(0), fwd(1), allreduce(), fwd(2), fwd(3), allreduce();
    }
    for (int64_t l = 0; l < layers; ++l) {
      bwd(3), bwd(2), allreduce(), bwd(1), bwd(0), allreduce();
    }
    if (r > 0) per_rep.push_back(in_allreduce / static_cast<double>(allreduces));
  }
  std::sort(per_rep.begin(), per_rep.end());
  RanksAtWork out;
  out.tp_allreduce_seconds = per_rep[per_rep.size() / 2];

  // The DP pattern, as the trainer's step runs it: the forward GEMMs of every layer, then each
  //    layer's backward GEMMs followed by the asynchronous all-reduce of that layer's gradients
  //    (the comm thread works beside the next layer's backward), the embeddings' last, all
  //    waited for at the end, then the loss's sum. The comm thread's seconds per step (what the
  //    worker reports as dp_comm_total) over the reps.
  const std::vector<Gemm> full = {{C, 3 * C}, {C, C}, {C, F}, {F, C}};
  std::vector<GemmBuffers> g = gemm_buffers(rows, full, 13);
  const int64_t layer_floats = 12 * C * C + 13 * C;  // one layer's parameters (GPT-2)
  const int64_t embedding_floats = (m.padded_vocab() + m.seq_len) * C;
  std::vector<std::vector<float>> grads(static_cast<size_t>(layers));
  for (auto& v : grads) v.assign(static_cast<size_t>(layer_floats), 0.0f);
  std::vector<float> embedding_grads(static_cast<size_t>(embedding_floats), 0.0f);
  float loss = 0;
  std::vector<double> comm_per_step;
  for (int r = 0; r <= reps; ++r) {
    const CommStats before = group.stats();
    for (int64_t l = 0; l < layers; ++l)
      for (size_t i = 0; i < full.size(); ++i)
        k::matmul_forward(g[i].out.data(), g[i].inp.data(), g[i].weight.data(), nullptr, rows,
                          full[i].C, full[i].OC);
    std::vector<std::shared_ptr<CommWork>> works;
    for (int64_t l = layers - 1; l >= 0; --l) {
      for (size_t i = full.size(); i-- > 0;)
        k::matmul_backward(g[i].dinp.data(), g[i].dweight.data(), g[i].dbias.data(),
                           g[i].out.data(), g[i].inp.data(), g[i].weight.data(), rows, full[i].C,
                           full[i].OC, false);
      works.push_back(group.allreduce_async(grads[l].data(), grads[l].size(), ReduceOp::kSum));
    }
    works.push_back(
        group.allreduce_async(embedding_grads.data(), embedding_grads.size(), ReduceOp::kSum));
    for (auto& w : works) w->wait();
    group.allreduce(&loss, 1);
    if (r > 0) comm_per_step.push_back(group.stats().seconds - before.seconds);
  }
  std::sort(comm_per_step.begin(), comm_per_step.end());
  out.dp_step_comm_seconds = comm_per_step[comm_per_step.size() / 2];
  out.dp_step_bytes = 4.0 * static_cast<double>(layers * layer_floats + embedding_floats);
  out.dp_step_allreduces = static_cast<int>(layers) + 2;
  return out;
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw Error("profile: no socket for the all-reduce test");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    throw Error("profile: no free loopback port for the all-reduce test");
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace

namespace profiling {

Shapes shapes_of(const ProfileOptions& options) {
  Shapes out;
  if (options.plan) {
    out.model = options.plan->model;
    out.B = options.plan->config.micro_batch;
    out.T = out.model.seq_len;
  } else {
    const api::ModelPreset* preset = api::find_model_preset(options.quick ? "tiny" : "gpt2-124m");
    if (!preset) throw Error("profile: no built-in model to measure");
    out.model = preset->dims;
    out.T = options.quick ? out.model.seq_len : 64;
  }
  out.reps = options.quick ? 3 : 7;
  return out;
}

std::vector<float> random_floats(int64_t n, uint32_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& x : v) x = u(rng);
  return v;
}

double micro_batch_flops(const Shapes& shapes) {
  const api::ModelDims& m = shapes.model;
  return api::gpt_flops_per_token(static_cast<double>(api::parameter_count(m)), m.layers,
                                  m.hidden, shapes.T) *
         static_cast<double>(shapes.B * shapes.T);
}

double median_seconds(int reps, const std::function<void()>& fn) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void say(const std::string& what, double value, const char* unit) {
  std::fprintf(stderr, "profile: %-44s %12.4g %s\n", what.c_str(), value, unit);
}

double cpu_adamw_params_per_second(int64_t n, int reps) {
  std::vector<float> p = random_floats(n, 6), g = random_floats(n, 7), m(n, 0.0f), v(n, 0.0f);
  kernels::AdamWStep step;
  step.learning_rate = 1e-4f;
  const double s = median_seconds(
      reps, [&] { k::adamw_update(p.data(), g.data(), m.data(), v.data(), n, step); });
  return static_cast<double>(n) / s;
}

void set_two_rank_figures(api::HardwareProfile& hw, std::map<std::string, double>& record,
                          const std::string& ranks, double one_float_seconds, double big_seconds,
                          double big_bytes, double gemm_alone_seconds, double gemm_beside_seconds) {
  hw.allreduce_latency = one_float_seconds / 2.0;
  hw.intra_allreduce_busbw = big_bytes / std::max(big_seconds - 2.0 * hw.allreduce_latency, 1e-9);
  // An op that hides an all-reduce of duration c takes interference·min(op, c) longer
  // (api/hardware.h); the all-reduces cover the whole GEMM sequence here.
  hw.overlap_interference = std::clamp(gemm_beside_seconds / gemm_alone_seconds - 1.0, 0.0, 4.0);
  record["gemmSecondsAlone"] = gemm_alone_seconds;
  record["gemmSecondsBesideAllreduce"] = gemm_beside_seconds;
  say("all-reduce latency α (" + ranks + ", per ring step)", hw.allreduce_latency * 1e6, "us");
  say("all-reduce bus bandwidth (" + ranks + ")", hw.intra_allreduce_busbw / 1e9, "GB/s");
  say("GEMM slow-down beside all-reduces", hw.overlap_interference, "");
}

double recompute_rate_ratio(const api::ModelDims& m, int64_t B, int64_t T, double step_flops,
                            double plain_seconds, double full_seconds, double plain_again_seconds) {
  const double b = static_cast<double>(B), s = static_cast<double>(T);
  const double h = static_cast<double>(m.hidden), f = static_cast<double>(m.ffn_hidden);
  const double recompute_flops =
      static_cast<double>(m.layers) * (8 * b * s * h * h + 4 * b * s * h * f + 4 * b * s * s * h);
  const double added = full_seconds - 0.5 * (plain_seconds + plain_again_seconds);
  const double recompute_rate = recompute_flops / std::max(added, 1e-9);
  return std::clamp(recompute_rate / (step_flops / plain_seconds), 0.5, 3.0);
}

namespace {

std::string hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown";
  return name;
}

std::string utc_now() {  // RFC 3339, seconds
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

}  // namespace

void finish_profile(api::MeasuredProfile& out, const ProfileOptions& options, const Shapes& shapes,
                    const std::map<std::string, std::string>& device) {
  const api::ModelDims& m = shapes.model;
  out.provenance = device;
  out.provenance["host"] = hostname();
  out.provenance["cpu"] = cpu_model_name();
  out.provenance["model"] = "L=" + std::to_string(m.layers) + " h=" + std::to_string(m.hidden) +
                            " B=" + std::to_string(shapes.B) + " T=" + std::to_string(shapes.T);
  out.provenance["date"] = utc_now();
  out.provenance["version"] = options.version;
  out.provenance["command"] = options.command;
  out.profile.source = "measured on " + out.provenance["host"] + " " + out.provenance["date"];
  out.profile.measured = true;
}

void with_second_rank(const std::function<void(Communicator&)>& second,
                      const std::function<void(Communicator&)>& first, SecondRank where) {
  RendezvousConfig config;
  config.master_port = free_port();
  config.world_size = 2;
  config.job_id = "profile";
  config.timeout = std::chrono::seconds(30);
  if (where == SecondRank::kThread) {
    std::string failed;
    std::thread rank1([&] {
      try {
        RendezvousConfig mine = config;
        mine.rank = 1;
        ProcessGroups groups = connect_process_groups(mine, 1, 2);
        second(*groups.dp);
      } catch (const std::exception& e) {
        failed = e.what();
      }
    });
    try {
      ProcessGroups groups = connect_process_groups(config, 1, 2);
      first(*groups.dp);
    } catch (...) {
      rank1.join();  // it fails too: its peer's sockets close (or its rendezvous times out)
      throw;
    }
    rank1.join();
    if (!failed.empty()) throw Error("profile: the second rank failed: " + failed);
    return;
  }
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child < 0) throw Error("profile: cannot start the second rank (fork failed)");
  if (child == 0) {
    try {
      config.rank = 1;
      ProcessGroups groups = connect_process_groups(config, 1, 2);
      second(*groups.dp);
      std::fflush(nullptr);
      ::_exit(0);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "profile: the second rank failed: %s\n", e.what());
      ::_exit(1);
    }
  }
  try {
    ProcessGroups groups = connect_process_groups(config, 1, 2);
    first(*groups.dp);
  } catch (...) {
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    throw;
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw Error("profile: the second rank of the all-reduce test failed");
}

}  // namespace profiling

api::MeasuredProfile measure_profile(const ProfileOptions& options) {
  const int threads = options.threads > 0
                          ? options.threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  omp_set_num_threads(threads);
  const profiling::Shapes shapes = profiling::shapes_of(options);
  const api::ModelDims& m = shapes.model;
  const int64_t B = shapes.B, T = shapes.T;
  const int reps = shapes.reps;
  const int64_t BT = B * T;
  api::MeasuredProfile out;
  out.profile = api::cpu_profile();
  auto& hw = out.profile;
  auto& record = out.measurements;
  std::fprintf(stderr, "profile: %d thread(s), the GEMMs and one micro-batch of L=%lld h=%lld at "
               "B=%lld T=%lld\n", threads, static_cast<long long>(m.layers),
               static_cast<long long>(m.hidden), static_cast<long long>(B),
               static_cast<long long>(T));

  // 1. The model's GEMMs.
  const auto gemms = model_gemms(m);
  std::vector<GemmBuffers> buffers = gemm_buffers(BT, gemms, 1);
  double gemm_flops = 0;
  const double gemm_s = median_seconds(reps, [&] { gemm_flops = run_gemms(BT, gemms, buffers); });
  const double gemm_rate = gemm_flops / gemm_s;
  hw.peak_fp32_flops = gemm_rate / threads;
  record["gemmFlopsPerSecond"] = gemm_rate;
  say("model GEMMs (fwd + bwd), all threads", gemm_rate / 1e9, "GFLOP/s");

  // 2. One micro-batch of the model itself.
  const double micro_flops = profiling::micro_batch_flops(shapes);
  std::vector<float> weights;  // every micro-batch model's (TimedModel)
  {
    const double before = device_bytes_in_use();
    auto plain = std::make_unique<TimedModel>(m, B, T, weights, api::Precision::kFp32);
    const double plain_bytes = device_bytes_in_use() - before;
    const double step_s = plain->seconds(reps);
    const double step_rate = micro_flops / step_s;
    hw.achieved_fraction = std::clamp(step_rate / gemm_rate, 0.01, 1.0);
    record["microBatchSeconds"] = step_s;
    record["microBatchFlopsPerSecond"] = step_rate;
    say("micro-batch (fwd + bwd, the model's FLOPs)", step_rate / 1e9, "GFLOP/s");
    say("  = achieved fraction of the GEMM rate", hw.achieved_fraction, "");
    // What full recompute adds, bracketed by a second plain measurement — of the same model
    // where two fit in available memory with room to spare (building one takes seconds), else of a
    // new one.
    if (2 * plain_bytes > static_cast<double>(available_host_bytes())) plain.reset();
    const double full_s =
        TimedModel(m, B, T, weights, api::Precision::kFp32, api::Recompute::kFull).seconds(reps);
    const double again_s = plain
                               ? plain->seconds(reps)
                               : TimedModel(m, B, T, weights, api::Precision::kFp32).seconds(reps);
    plain.reset();
    record["microBatchSecondsAfterwards"] = again_s;
    hw.recompute_rate_ratio =
        profiling::recompute_rate_ratio(m, B, T, micro_flops, step_s, full_s, again_s);
    record["microBatchFullRecomputeSeconds"] = full_s;
    say("micro-batch with full recompute", full_s * 1e3, "ms");
    say("  = recompute rate over the micro-batch's", hw.recompute_rate_ratio, "");
  }

  // 2b. The same in bf16 where the CPU has bf16 matmuls (AMX-BF16 or AVX512-BF16).
  const std::string isa = k::bf16_matmul_isa();
  hw.has_bf16 = !isa.empty();
  if (hw.has_bf16) {
    for (size_t i = 0; i < gemms.size(); ++i) {
      buffers[i].weight16.resize(buffers[i].weight.size());
      k::to_bf16(buffers[i].weight16.data(), buffers[i].weight.data(),
                 static_cast<int64_t>(buffers[i].weight.size()));
    }
    double flops16 = 0;
    const double gemm16_s =
        median_seconds(reps, [&] { flops16 = run_gemms(BT, gemms, buffers, true); });
    const double gemm16_rate = flops16 / gemm16_s;
    hw.peak_bf16_flops = gemm16_rate / threads;
    record["bf16GemmFlopsPerSecond"] = gemm16_rate;
    say("model GEMMs in bf16 (" + isa + "), all threads", gemm16_rate / 1e9,
        "GFLOP/s");
    const double step16_s = TimedModel(m, B, T, weights, api::Precision::kBf16).seconds(reps);
    const double step16_rate = micro_flops / step16_s;
    hw.achieved_fraction_bf16 = std::clamp(step16_rate / gemm16_rate, 0.01, 1.0);
    record["bf16MicroBatchSeconds"] = step16_s;
    say("bf16 micro-batch (fwd + bwd)", step16_rate / 1e9, "GFLOP/s");
    say("  = achieved fraction of the bf16 GEMM rate", hw.achieved_fraction_bf16, "");
  } else {
    std::fprintf(stderr, "profile: bf16: this CPU has neither AMX-BF16 nor AVX512-BF16 (planned "
                 "in fp32)\n");
  }

  std::vector<float>().swap(weights);

  // 3. Memory: a triad over all threads; memcpy on one.
  {
    const int64_t n = options.quick ? (int64_t{1} << 22) : (int64_t{1} << 25);
    std::vector<float> a(static_cast<size_t>(n)), b = random_floats(n, 4), c = random_floats(n, 5);
    const double s = median_seconds(reps, [&] {
#pragma omp parallel for
      for (int64_t i = 0; i < n; ++i) a[i] = b[i] + 0.5f * c[i];
    });
    const double triad = 3.0 * 4.0 * static_cast<double>(n) / s;
    hw.memory_bandwidth = triad / threads;
    record["triadBytesPerSecond"] = triad;
    say("memory triad, all threads", triad / 1e9, "GB/s");
    const double copy_s =
        median_seconds(reps, [&] { std::memcpy(a.data(), b.data(), a.size() * sizeof(float)); });
    hw.host_link_bandwidth = 4.0 * static_cast<double>(n) / copy_s;
    record["memcpyBytesPerSecond"] = hw.host_link_bandwidth;
    say("memcpy, one thread", hw.host_link_bandwidth / 1e9, "GB/s");
  }

  // 4. The CPU AdamW kernel.
  {
    const double rate =
        profiling::cpu_adamw_params_per_second(options.quick ? (int64_t{1} << 20) : (int64_t{1} << 23), reps);
    hw.cpu_adam_params_per_core = rate / threads;
    record["adamwParamsPerSecond"] = rate;
    say("AdamW, all threads", rate / 1e6, "M params/s");
  }

  // 5. All-reduce between 2 ranks — this process and a child, as two ranks of a node are, Gloo
  //    over loopback TCP — and the GEMMs' slow-down while all-reduces run beside them. The child
  //    makes the same calls in the same order; the last phase stops in band (the sum of a flag).
  {
    const int64_t big = int64_t{1} << 20;  // 4 MiB of floats
    const int small_times = options.quick ? 20 : 100, big_times = options.quick ? 2 : 8;
    std::vector<float> x(big, 1.0f);
    double small_s = 0, big_s = 0, alone = 0, beside = 0;
    profiling::with_second_rank(
        [&](Communicator& group) {  // rank 1: only the all-reduces, then out
          for (int i = 0; i < (reps + 1) * small_times; ++i) group.allreduce(x.data(), 1);
          for (int i = 0; i < (reps + 1) * big_times; ++i) group.allreduce(x.data(), big);
          do {
            x[0] = 0.0f;
            group.allreduce(x.data(), big);
          } while (x[0] > 0.5f);
        },
        [&](Communicator& group) {
          small_s = median_seconds(reps,
                                   [&] {
                                     for (int i = 0; i < small_times; ++i)
                                       group.allreduce(x.data(), 1);
                                   }) /
                    small_times;
          big_s = median_seconds(reps,
                                 [&] {
                                   for (int i = 0; i < big_times; ++i)
                                     group.allreduce(x.data(), big);
                                 }) /
                  big_times;
          alone = median_seconds(reps, [&] { run_gemms(BT, gemms, buffers); });
          std::atomic<bool> stop{false};
          std::thread noise([&] {
            for (;;) {
              x[0] = stop.load() ? 0.0f : 1.0f;
              group.allreduce(x.data(), big);
              if (x[0] < 0.5f) return;
            }
          });
          beside = median_seconds(reps, [&] { run_gemms(BT, gemms, buffers); });
          stop = true;
          noise.join();
        });
    profiling::set_two_rank_figures(hw, record, "2 processes, Gloo", small_s, big_s,
                                    4.0 * static_cast<double>(big), alone, beside);
    record["allreduce1FloatSeconds"] = small_s;
    record["allreduce4MiBSeconds"] = big_s;
  }

  // 6. The same all-reduces with both ranks at work (ranks_at_work): what they take there over
  //    what step 5's α and bus bandwidth predict becomes the profile's tpCommScale and
  //    dpCommScale (the scales autotune's fold-back refines later from a running job).
  {
    const int rank_threads = std::max(1, threads / 2);
    const int64_t C = m.hidden;
    RanksAtWork at_work;
    auto both = [&](Communicator& group) {
      omp_set_num_threads(rank_threads);
      return ranks_at_work(group, BT, m, reps);
    };
    profiling::with_second_rank([&](Communicator& group) { both(group); },
                     [&](Communicator& group) { at_work = both(group); });
    omp_set_num_threads(threads);
    // Step 5's figures, n = 2: 2α per all-reduce plus the bytes over the bus bandwidth.
    auto idle_prediction = [&](int allreduces, double bytes) {
      return allreduces * 2.0 * hw.allreduce_latency + bytes / hw.intra_allreduce_busbw;
    };
    const double tp_predicted = idle_prediction(1, 4.0 * static_cast<double>(BT * C));
    const double dp_predicted = idle_prediction(at_work.dp_step_allreduces, at_work.dp_step_bytes);
    hw.tp_comm_scale = std::clamp(at_work.tp_allreduce_seconds / tp_predicted, 1.0, 100.0);
    hw.dp_comm_scale = std::clamp(at_work.dp_step_comm_seconds / dp_predicted, 1.0, 100.0);
    record["tpAllreduceAtWorkSeconds"] = at_work.tp_allreduce_seconds;
    record["dpStepAllreduceAtWorkSeconds"] = at_work.dp_step_comm_seconds;
    say("TP all-reduce, both ranks at work (activations)", at_work.tp_allreduce_seconds * 1e3,
        "ms");
    say("  = tpCommScale (over the idle prediction)", hw.tp_comm_scale, "");
    say("DP all-reduces of a step, beside the backward", at_work.dp_step_comm_seconds * 1e3, "ms");
    say("  = dpCommScale (over the idle prediction)", hw.dp_comm_scale, "");
  }

  profiling::finish_profile(out, options, shapes,
                            {{"gpu", "none"}, {"threads", std::to_string(threads)}});
  return out;
}

}  // namespace kt::worker
