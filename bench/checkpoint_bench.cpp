// Checkpoint throughput against the disk measured in the same run: save_checkpoint (safetensors
// shard hashed with SHA-256 while written, fsync, metadata.json, rename, `latest`) and the verify
// path of load_latest_checkpoint (read straight into the tensors, hashed, compared with
// metadata.json), each against a plain write + fsync and a plain read of the same bytes in the
// same pieces (one write or read per tensor), and SHA-256 over the bytes in memory, which bounds
// both checkpoint paths from above. The state is GPT-2 124M's (llm.c's 16 tensors at L = 12,
// C = 768, Vp = 50304, maxT = 1024: 124,475,904 parameters) plus both AdamW moments, 1.49 GB.
// Reads are cold: each file's pages are dropped from the page cache (posix_fadvise DONTNEED,
// after its fsync) before it is read. Every repetition writes into a fresh directory, removed
// untimed afterwards; the order of checkpoint and plain alternates between repetitions. GB = 1e9.
// Usage: bench_checkpoint [--dir D] [--reps N] [--layers L] [--channels C]
//   --dir       where to write (default: the temp directory); a fresh subdirectory is made there
//               and removed at the end
//   --reps      repetitions, median reported (default 5; no warm-up: every repetition is cold)
//   --layers, --channels   a smaller state for a quick run (default 12 and 768)
#include <fcntl.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "api/error.h"
#include "worker/checkpoint.h"
#include "worker/durable_file.h"
#include "worker/gpt_layout.h"
#include "worker/sha256.h"

namespace {

namespace fs = std::filesystem;
using kt::worker::TensorView;

// llm.c's parameter names and shapes at GPT-2's vocab and context, from the parameter table.
std::vector<std::pair<std::string, std::vector<int64_t>>> gpt2_shapes(int64_t L, int64_t C) {
  kt::worker::GptConfig c;
  c.max_seq_len = 1024;
  c.vocab = 50257;
  c.padded_vocab = 50304;
  c.layers = L;
  c.heads = C / 64;
  c.channels = C;
  c.ffn = 4 * C;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (int i = 0; i < kt::worker::kNumParamTensors; ++i)
    shapes.emplace_back(kt::worker::kParams[static_cast<size_t>(i)].name,
                        kt::worker::gpt_llmc_shape(c, i));
  return shapes;
}

// Parameters and both moments, one allocation per tensor, filled with varied values.
struct State {
  std::vector<std::vector<float>> storage;  // params, then adam_m, then adam_v
  kt::worker::CheckpointTensors tensors;
  std::vector<const TensorView*> all;  // every view, in checkpoint file order
  uint64_t bytes = 0;
};

void build_state(State& state, int64_t L, int64_t C) {
  const auto shapes = gpt2_shapes(L, C);
  uint32_t x = 12345;
  for (std::vector<TensorView>* views :
       {&state.tensors.params, &state.tensors.adam_m, &state.tensors.adam_v}) {
    for (const auto& [name, shape] : shapes) {
      TensorView view;
      view.name = name;
      view.shape = shape;
      auto& data = state.storage.emplace_back(view.numel());
      for (float& f : data) f = static_cast<float>((x = x * 1664525u + 1013904223u) >> 8) * 1e-7f;
      view.data = data.data();
      views->push_back(view);
      state.bytes += view.bytes();
    }
  }
  for (const auto* views : {&state.tensors.params, &state.tensors.adam_m, &state.tensors.adam_v})
    for (const TensorView& v : *views) state.all.push_back(&v);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Drops a file's (clean, fsync'd) pages from the page cache, so that the next read comes from
// the disk.
void drop_cached(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) kt::worker::throw_io_error("open", path);
  const int err = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  if (err != 0) kt::worker::throw_io_error("posix_fadvise", path, err);
}

void drop_cached_tree(const std::string& dir) {
  for (const auto& entry : fs::recursive_directory_iterator(dir))
    if (entry.is_regular_file()) drop_cached(entry.path().string());
}

struct Stats {
  double median, min, max;
};

Stats stats_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

std::string filesystem_type(const std::string& path) {
  struct statfs s;
  if (::statfs(path.c_str(), &s) != 0) return "unknown";
  switch (static_cast<unsigned long>(s.f_type)) {
    case 0xEF53:
      return "ext2/3/4";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0x01021994:
      return "tmpfs (memory, not a disk)";
    case 0x794C7630:
      return "overlayfs";
    case 0x6969:
      return "nfs";
    default: {
      char hex[32];
      std::snprintf(hex, sizeof hex, "0x%lx", static_cast<unsigned long>(s.f_type));
      return hex;
    }
  }
}

int usage(const char* problem) {
  std::fprintf(stderr,
               "bench_checkpoint: %s\nusage: bench_checkpoint [--dir D] [--reps N] "
               "[--layers L] [--channels C]\n",
               problem);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string parent = fs::temp_directory_path().string();
  int reps = 5;
  int64_t layers = 12, channels = 768;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::printf(
          "usage: bench_checkpoint [--dir D] [--reps N] [--layers L] [--channels C]\n"
          "Checkpoint write and verify throughput of a GPT-2-shaped state (default L 12, C 768)\n"
          "against the disk's own write and read rates, measured in D (default: the temp dir).\n");
      return 0;
    }
    if (i + 1 >= argc) return usage(("missing value after " + flag).c_str());
    const std::string value = argv[++i];
    if (flag == "--dir") {
      parent = value;
    } else if (flag == "--reps" || flag == "--layers" || flag == "--channels") {
      char* end = nullptr;
      const long long n = std::strtoll(value.c_str(), &end, 10);
      if (*end != '\0' || n < 1) return usage((flag + " needs a positive integer").c_str());
      if (flag == "--reps") reps = static_cast<int>(n);
      if (flag == "--layers") layers = n;
      if (flag == "--channels") channels = n;
    } else {
      return usage(("unknown flag " + flag).c_str());
    }
  }

  std::string work = parent + "/kt-bench-checkpoint-XXXXXX";
  if (::mkdtemp(work.data()) == nullptr) {
    std::fprintf(stderr, "bench_checkpoint: cannot create a directory in %s: %s\n", parent.c_str(),
                 std::strerror(errno));
    return 1;
  }
  int status = 0;
  try {
    State state;
    build_state(state, layers, channels);
    int64_t params = 0;
    for (const TensorView& v : state.tensors.params) params += v.numel();
    const double gb = state.bytes / 1e9;
    std::printf("state: L=%lld C=%lld, %lld parameters + AdamW m and v = %.3f GB\n",
                static_cast<long long>(layers), static_cast<long long>(channels),
                static_cast<long long>(params), gb);
    std::printf("directory: %s (%s); %d repetitions, cold reads\n", work.c_str(),
                filesystem_type(work).c_str(), reps);

    std::vector<double> save_s, verify_s, write_s, read_s, hash_s;
    for (int rep = 0; rep < reps; ++rep) {
      const std::string root = work + "/rep-" + std::to_string(rep);
      const std::string plain = work + "/plain-" + std::to_string(rep) + ".bin";
      auto run_checkpoint = [&] {
        kt::worker::CheckpointMeta meta;
        meta.step = rep;
        auto t0 = std::chrono::steady_clock::now();
        kt::worker::save_checkpoint(root, meta, state.tensors, /*keep=*/1);
        save_s.push_back(seconds_since(t0));
        drop_cached_tree(root);
        t0 = std::chrono::steady_clock::now();
        const auto loaded = kt::worker::load_latest_checkpoint(root, state.tensors);
        verify_s.push_back(seconds_since(t0));
        if (!loaded || loaded->step != rep) throw kt::Error("the checkpoint did not load back");
      };
      auto run_plain = [&] {
        auto t0 = std::chrono::steady_clock::now();
        {
          kt::worker::CheckedFile file(plain, O_WRONLY | O_CREAT | O_TRUNC);
          for (const TensorView* v : state.all) file.write_all(v->data, v->bytes());
          file.sync();
          file.close();
        }
        write_s.push_back(seconds_since(t0));
        drop_cached(plain);
        t0 = std::chrono::steady_clock::now();
        kt::worker::CheckedFile file(plain, O_RDONLY);
        for (const TensorView* v : state.all) {
          if (!file.read_exact(v->data, v->bytes())) throw kt::Error(plain + " is short");
        }
        read_s.push_back(seconds_since(t0));
      };
      if (rep % 2 == 0) {
        run_checkpoint();
        run_plain();
      } else {
        run_plain();
        run_checkpoint();
      }
      const auto t0 = std::chrono::steady_clock::now();
      kt::worker::Sha256 sha;
      for (const TensorView* v : state.all) sha.update(v->data, v->bytes());
      sha.hex_digest();
      hash_s.push_back(seconds_since(t0));
      fs::remove_all(root);
      fs::remove(plain);
    }

    const Stats save = stats_of(save_s), verify = stats_of(verify_s), write = stats_of(write_s),
                read = stats_of(read_s), hash = stats_of(hash_s);
    std::printf("%-34s %10s %10s %10s %10s\n", "", "GB/s", "min", "max", "of disk");
    auto row = [&](const char* what, const Stats& s, const Stats* disk) {
      // Throughput is bytes / time: the slowest repetition gives the lowest rate.
      std::printf("%-34s %10.3f %10.3f %10.3f", what, gb / s.median, gb / s.max, gb / s.min);
      if (disk) {
        std::printf(" %9.0f%%\n", 100 * disk->median / s.median);
      } else {
        std::printf(" %10s\n", "");
      }
    };
    row("plain write + fsync", write, nullptr);
    row("checkpoint write (save_checkpoint)", save, &write);
    row("plain read", read, nullptr);
    row("checkpoint verify (load + SHA-256)", verify, &read);
    row("SHA-256 in memory", hash, nullptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_checkpoint: %s\n", e.what());
    status = 1;
  }
  std::error_code ec;
  fs::remove_all(work, ec);
  return status;
}
