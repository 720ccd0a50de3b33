// The checkpoint protocol (docs/CHECKPOINTS.md): step directories, the `latest` commit point,
// shards and metadata.json, sharded saves, loading with fallback past damaged checkpoints, the
// writer's lock, retention. Durable file operations are worker/durable_file.h, the checksum
// worker/sha256.h, the shard format worker/safetensors.h.
#include "worker/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <thread>

#include "api/error.h"
#include "api/yaml_json.h"
#include "worker/durable_file.h"
#include "worker/safetensors.h"
#include "worker/sha256.h"

namespace kt::worker {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

static_assert(std::endian::native == std::endian::little,
              "checkpoint shards hold little-endian data written straight from memory");

constexpr const char* kFormat = "kubetrain-checkpoint/v1";
constexpr const char* kShardName = "rank-00000.safetensors";
constexpr const char* kMetadataName = "metadata.json";
constexpr const char* kTmpPrefix = ".tmp-";
constexpr size_t kScratchBytes = 16 << 20;  // read size for bytes that are only checksummed

// ---- errors -------------------------------------------------------------------------------------

// A failed system call throws IoError (worker/durable_file.h); the loader counts some of these as
// damage (is_damage).

// A damaged checkpoint (as opposed to one that does not fit the model): the loader reports it and
// tries the previous one.
class Corrupt : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

void warn(const std::string& line) {
  std::fprintf(stderr, "kubetrain-worker: %s\n", line.c_str());
}

std::string pid_text() {
  return std::to_string(::getpid());
}

// Bytes read from a file, as a JSON string for a message: invalid UTF-8 becomes U+FFFD (dump()
// would throw on it).
std::string json_quoted(const std::string& bytes) {
  return Json(bytes).dump(-1, ' ', false, Json::error_handler_t::replace);
}

// ---- tensors ------------------------------------------------------------------------------------

// Where a view sits in its logical tensor; a view with no logical_shape is the whole tensor.
struct Slice {
  std::vector<int64_t> logical_shape;
  std::vector<int64_t> offset;
  bool operator==(const Slice&) const = default;
};

Slice slice_of(const TensorView& view) {
  if (view.logical_shape.empty()) return {view.shape, std::vector<int64_t>(view.shape.size(), 0)};
  return {view.logical_shape, view.offset};
}

std::string slice_json(const Slice& slice) {
  return Json{{"logical_shape", slice.logical_shape}, {"offset", slice.offset}}.dump();
}

// A view under its checkpoint name ("param/h.0.qkvw").
struct NamedView {
  std::string name;
  const TensorView* view;
};

void check_view(const std::string& name, const TensorView& view) {
  const std::string where = "checkpoint tensor " + name + ": ";
  for (int64_t d : view.shape) {
    if (d < 0) throw Error(where + "negative dimension in shape " + shape_text(view.shape));
  }
  if (view.data == nullptr && view.numel() > 0) throw Error(where + "no data");
  if (view.logical_shape.empty()) return;
  const size_t rank = view.shape.size();
  if (view.logical_shape.size() != rank || view.offset.size() != rank) {
    throw Error(where + "shape " + shape_text(view.shape) + ", logical_shape " +
                shape_text(view.logical_shape) + " and offset " + shape_text(view.offset) +
                " differ in rank");
  }
  for (size_t i = 0; i < rank; ++i) {
    if (view.offset[i] < 0 || view.offset[i] + view.shape[i] > view.logical_shape[i]) {
      throw Error(where + "slice at offset " + shape_text(view.offset) + " of shape " +
                  shape_text(view.shape) + " exceeds the logical shape " +
                  shape_text(view.logical_shape));
    }
  }
}

// The tensors in file order: params, then the moments (which are optional but, when given, must
// mirror the params).
std::vector<NamedView> named_views(const CheckpointTensors& tensors) {
  std::vector<NamedView> views;
  for (const TensorView& p : tensors.params) views.push_back({"param/" + p.name, &p});
  auto add_moments = [&](const std::vector<TensorView>& moments, const std::string& prefix) {
    if (moments.empty()) return;
    if (moments.size() != tensors.params.size()) {
      throw Error("checkpoint tensors: " + std::to_string(moments.size()) + " " + prefix +
                  " tensors for " + std::to_string(tensors.params.size()) + " params");
    }
    for (size_t i = 0; i < moments.size(); ++i) {
      const TensorView& p = tensors.params[i];
      if (moments[i].name != p.name || moments[i].shape != p.shape) {
        throw Error("checkpoint tensor " + prefix + moments[i].name + " " +
                    shape_text(moments[i].shape) + " does not mirror param/" + p.name + " " +
                    shape_text(p.shape));
      }
      views.push_back({prefix + moments[i].name, &moments[i]});
    }
  };
  add_moments(tensors.adam_m, "adam_m/");
  add_moments(tensors.adam_v, "adam_v/");
  std::map<std::string, int> seen;
  for (const NamedView& v : views) {
    if (seen[v.name]++) throw Error("checkpoint tensor " + v.name + " is given twice");
    check_view(v.name, *v.view);
  }
  return views;
}

// ---- directory names ----------------------------------------------------------------------------

std::string step_dir_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return name;
}

// The step of a directory named exactly as step_dir_name writes it.
std::optional<int64_t> parse_step_dir_name(const std::string& name) {
  if (name.rfind("step-", 0) != 0) return std::nullopt;
  int64_t step = 0;
  const char* first = name.data() + 5;
  const char* last = name.data() + name.size();
  const auto [end, ec] = std::from_chars(first, last, step);
  if (ec != std::errc() || end != last || step < 0 || step_dir_name(step) != name) {
    return std::nullopt;
  }
  return step;
}

// step → directory path of every step-* directory under root.
std::map<int64_t, std::string> list_step_dirs(const std::string& root) {
  std::map<int64_t, std::string> steps;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const auto step = parse_step_dir_name(name);
    std::error_code dir_ec;
    if (step && it->is_directory(dir_ec)) steps[*step] = root + "/" + name;
  }
  if (ec) throw Error("cannot list " + root + ": " + ec.message());
  return steps;
}

std::vector<std::string> list_tmp_entries(const std::string& root) {
  std::vector<std::string> paths;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(kTmpPrefix, 0) == 0) paths.push_back(root + "/" + name);
  }
  if (ec) throw Error("cannot list " + root + ": " + ec.message());
  return paths;
}

// ---- saving -------------------------------------------------------------------------------------

struct WrittenFile {
  uint64_t bytes = 0;
  std::string sha256;
};

WrittenFile write_shard(const std::string& path, const std::vector<NamedView>& views) {
  std::vector<safetensors::TensorInfo> infos;
  std::map<std::string, std::string> metadata = {{"rank", "0"}, {"world", "1"}};
  for (const NamedView& v : views) {
    infos.push_back({v.name, v.view->shape});
    metadata["slice/" + v.name] = slice_json(slice_of(*v.view));
  }
  const std::string header = safetensors::encode_header(infos, metadata);
  CheckedFile file(path, O_WRONLY | O_CREAT | O_TRUNC);
  Sha256 sha;
  WrittenFile written;
  file.write_all(header.data(), header.size());
  sha.update(header.data(), header.size());
  written.bytes = header.size();
  for (const NamedView& v : views) {
    file.write_all(v.view->data, v.view->bytes());
    sha.update(v.view->data, v.view->bytes());
    written.bytes += v.view->bytes();
  }
  file.sync();
  file.close();
  written.sha256 = sha.hex_digest();
  return written;
}

// Moves the finished temp directory to `final_dir`. Re-saving a step (after a resume) swaps the
// two atomically, so the step never disappears; where the filesystem cannot, the old one is
// moved aside to a .tmp- name first (a crash then leaves it for the next save to remove).
void publish_dir(const std::string& tmp, const std::string& final_dir, const std::string& root) {
  if (!path_exists(final_dir)) {
    rename_path(tmp, final_dir);
    return;
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    sync_dir(root);
    remove_tree(tmp);  // now the old checkpoint
    return;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) {
    throw_io_error("exchange " + tmp + " with", final_dir);
  }
  const std::string old =
      root + "/" + kTmpPrefix + "old-" + fs::path(final_dir).filename().string() + "-" + pid_text();
  remove_tree(old);
  rename_path(final_dir, old);
  rename_path(tmp, final_dir);
  sync_dir(root);
  remove_tree(old);
}

// Keeps the checkpoint just written and the keep-1 newest below it. Step directories above it
// belong to an abandoned timeline (the run resumed from an earlier checkpoint because they were
// corrupt or because `latest` was rolled back): the loader ignores them, so they go too. Each is
// first renamed to a .tmp- name so that a crash never leaves a half-deleted step directory.
void remove_old_checkpoints(const std::string& root, int64_t newest_step, int keep) {
  const auto steps = list_step_dirs(root);
  int kept = 0;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (it->first <= newest_step && kept < keep) {
      ++kept;
      continue;
    }
    const std::string retired = root + "/" + kTmpPrefix + "retired-" +
                                fs::path(it->second).filename().string() + "-" + pid_text();
    if (::rename(it->second.c_str(), retired.c_str()) != 0) {
      warn("cannot remove old checkpoint " + it->second + ": " + std::strerror(errno));
    }
  }
  // Temp directories of interrupted saves, and the ones just retired.
  for (const std::string& path : list_tmp_entries(root)) remove_tree(path);
}

// ---- loading ------------------------------------------------------------------------------------

std::string read_metadata_text(const std::string& dir) {
  const std::string path = dir + "/" + kMetadataName;
  if (!path_exists(path)) throw Corrupt(std::string(kMetadataName) + " is missing");
  CheckedFile file(path, O_RDONLY);
  std::string text(file.size(), '\0');
  if (!file.read_exact(text.data(), text.size())) {
    throw Corrupt(std::string(kMetadataName) + " shrank while being read");
  }
  return text;
}

Json parse_metadata_json(std::string_view text) {
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    throw Corrupt(std::string(kMetadataName) + " is not valid JSON (" + e.what() + ")");
  }
}

// A shard's record in metadata.json's files: {"bytes": N, "checksum": "<sha256 hex>"}.
void check_file_record(const std::string& name, const Json& record) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    throw Corrupt(std::string(kMetadataName) + " lists a bad file name " + Json(name).dump());
  }
  if (!record.is_object() || !record.contains("bytes") || !record["bytes"].is_number_unsigned() ||
      !record.contains("checksum") || !record["checksum"].is_string()) {
    throw Corrupt(std::string(kMetadataName) + " has a bad record for " + name);
  }
}

CheckpointMeta decode_metadata(const Json& doc, const std::string& dir, int64_t step) {
  if (!doc.is_object()) throw Corrupt(std::string(kMetadataName) + " is not an object");
  for (const char* key :
       {"format", "step", "dataCursor", "rng", "planHash", "loss", "extra", "files"}) {
    if (!doc.contains(key)) throw Corrupt(std::string(kMetadataName) + " has no " + key);
  }
  const Json& format = doc["format"];
  if (!format.is_string()) throw Corrupt(std::string(kMetadataName) + " has a bad format");
  if (format != kFormat) {
    throw Error("checkpoint " + dir + " has format " + format.get<std::string>() +
                "; this kubetrain reads " + kFormat);
  }
  if (!doc["step"].is_number_integer() || doc["step"].get<int64_t>() != step) {
    throw Corrupt(std::string(kMetadataName) + " has step " + doc["step"].dump() +
                  ", not the directory's " + std::to_string(step));
  }
  if (!doc["planHash"].is_string() || !(doc["loss"].is_number() || doc["loss"].is_null()) ||
      !doc["files"].is_object() || doc["files"].empty()) {
    throw Corrupt(std::string(kMetadataName) + " has a bad planHash, loss or files");
  }
  for (const auto& [name, record] : doc["files"].items()) check_file_record(name, record);
  CheckpointMeta meta;
  meta.step = step;
  meta.data_cursor = doc["dataCursor"];
  meta.rng = doc["rng"];
  meta.plan_hash = doc["planHash"].get<std::string>();
  meta.loss =
      doc["loss"].is_null() ? std::numeric_limits<double>::quiet_NaN() : doc["loss"].get<double>();
  meta.extra = doc["extra"];
  return meta;
}

struct Shard;
// A Box is a block of a logical tensor: where it starts and its extent, per dimension.
struct Box {
  std::vector<int64_t> lo, extent;
};
// Resharding: the part of a view that one stored tensor holds (the two blocks in one logical
// shape; their intersection is copied).
struct Piece {
  Shard* shard;
  size_t index;
  const TensorView* view;
  Box stored, target;
};

// One shard, opened, its size checked and its header parsed; `sha` has consumed the header.
struct Shard {
  std::string name;
  std::string checksum;
  std::unique_ptr<CheckedFile> file;
  safetensors::Header header;
  Sha256 sha;
  std::vector<Slice> slices;               // per header.tensors
  std::vector<const TensorView*> targets;  // per header.tensors; null: checksum only
  // Per header.tensors: views of another layout that take their intersection with it.
  std::vector<std::vector<Piece>> pieces;
};

std::unique_ptr<Shard> open_shard(const std::string& dir, const std::string& name,
                                  const Json& record) {
  check_file_record(name, record);
  auto shard = std::make_unique<Shard>();
  shard->name = name;
  shard->checksum = record["checksum"].get<std::string>();
  const std::string path = dir + "/" + name;
  if (!path_exists(path)) throw Corrupt(name + " is missing");
  shard->file = std::make_unique<CheckedFile>(path, O_RDONLY);
  const uint64_t bytes = shard->file->size();
  const uint64_t recorded = record["bytes"].get<uint64_t>();
  if (bytes != recorded) {
    throw Corrupt(name + " has " + std::to_string(bytes) + " bytes but " + kMetadataName +
                  " records " + std::to_string(recorded) + (bytes < recorded ? ": truncated" : ""));
  }
  try {
    unsigned char first8[8];
    if (!shard->file->read_exact(first8, 8)) throw Error(name + ": shorter than 8 bytes");
    const uint64_t n = safetensors::decode_header_length(first8, bytes, name);
    std::string json(n, '\0');
    if (!shard->file->read_exact(json.data(), n)) throw Error(name + ": truncated header");
    shard->header = safetensors::decode_header(json, bytes, name);
    shard->sha.update(first8, 8);
    shard->sha.update(json.data(), json.size());
  } catch (const IoError&) {
    throw;
  } catch (const Error& e) {
    throw Corrupt(e.what());
  }
  for (const safetensors::TensorInfo& t : shard->header.tensors) {
    const auto found = shard->header.metadata.find("slice/" + t.name);
    Slice slice{t.shape, std::vector<int64_t>(t.shape.size(), 0)};
    if (found != shard->header.metadata.end()) {
      try {
        const Json s = Json::parse(found->second);
        slice = {s.at("logical_shape").get<std::vector<int64_t>>(),
                 s.at("offset").get<std::vector<int64_t>>()};
      } catch (const Json::exception& e) {
        throw Corrupt(name + ": bad slice metadata for " + t.name + " (" + e.what() + ")");
      }
      // The block must lie inside its logical tensor, of at most 2^62 elements.
      bool fits = slice.logical_shape.size() == t.shape.size() &&
                  slice.offset.size() == t.shape.size();
      int64_t elements = 1;
      for (size_t d = 0; fits && d < t.shape.size(); ++d) {
        const int64_t logical = slice.logical_shape[d], at = slice.offset[d];
        fits = logical >= 0 && logical <= (int64_t{1} << 62) && at >= 0 && at <= logical &&
               t.shape[d] <= logical - at &&
               !__builtin_mul_overflow(elements, logical, &elements) &&
               elements <= (int64_t{1} << 62);
      }
      if (!fits)
        throw Corrupt(name + ": the slice metadata of " + t.name + " (" +
                      found->second.substr(0, 200) +
                      ") does not place its " + shape_text(t.shape) + " block in its tensor");
    }
    shard->slices.push_back(std::move(slice));
  }
  shard->targets.assign(shard->header.tensors.size(), nullptr);
  shard->pieces.resize(shard->header.tensors.size());
  return shard;
}

// ---- resharding: a view assembled from the stored slices it intersects ----------------------

Box box_of(const Slice& slice, const std::vector<int64_t>& shape) { return {slice.offset, shape}; }

// The elements two blocks of one logical tensor share (0 when they do not touch).
int64_t overlap(const Box& a, const Box& b) {
  int64_t n = 1;
  for (size_t d = 0; d < a.lo.size(); ++d) {
    const int64_t lo = std::max(a.lo[d], b.lo[d]);
    const int64_t hi = std::min(a.lo[d] + a.extent[d], b.lo[d] + b.extent[d]);
    if (hi <= lo) return 0;
    n *= hi - lo;
  }
  return n;
}

int64_t volume(const std::vector<int64_t>& extent) {
  int64_t n = 1;
  for (int64_t e : extent) n *= e;
  return n;
}

// Copies the intersection of `from` (row-major data of block `a`) into `to` (block `b`) of the
// same logical tensor, a row of the last dimension at a time.
void copy_intersection(const float* from, const Box& a, float* to, const Box& b) {
  const size_t n = a.lo.size();
  std::vector<int64_t> lo(n), hi(n);
  for (size_t d = 0; d < n; ++d) {
    lo[d] = std::max(a.lo[d], b.lo[d]);
    hi[d] = std::min(a.lo[d] + a.extent[d], b.lo[d] + b.extent[d]);
    if (hi[d] <= lo[d]) return;
  }
  if (n == 0) {
    *to = *from;
    return;
  }
  const int64_t row = hi[n - 1] - lo[n - 1];
  std::vector<int64_t> at = lo;  // the logical index of the row's first element
  for (;;) {
    int64_t src = 0, dst = 0;
    for (size_t d = 0; d < n; ++d) {
      src = src * a.extent[d] + (at[d] - a.lo[d]);
      dst = dst * b.extent[d] + (at[d] - b.lo[d]);
    }
    std::memcpy(to + dst, from + src, static_cast<size_t>(row) * sizeof(float));
    size_t d = n - 1;  // next row: the odometer over every dimension but the last
    while (d > 0) {
      --d;
      if (++at[d] < hi[d]) break;
      at[d] = lo[d];
      if (d == 0) return;
    }
    if (n == 1) return;
  }
}

// A stored tensor: its shard and its index there.
struct Stored {
  Shard* shard;
  size_t index;
};

bool is_whole(const Slice& slice, const std::vector<int64_t>& shape) {
  return slice.logical_shape == shape &&
         std::all_of(slice.offset.begin(), slice.offset.end(), [](int64_t o) { return o == 0; });
}

// Fills `parts` with the stored slices that together hold view v exactly once, in the logical
// shape of the sliced side: a whole tensor may stand in another logical shape of as many
// elements (llm.c's qkvw [L, 3C, C] is the TP layout's [L, 3, C, C] whole). False when the
// stored slices do not cover it (`problem` stays empty: the caller says why) or, with
// `problem` set, when they overlap.
bool assemble(const NamedView& v, const std::vector<Stored>& stored, std::vector<Piece>& parts,
              std::string& problem) {
  const Slice want = slice_of(*v.view);
  const bool want_whole = is_whole(want, v.view->shape);
  std::vector<int64_t> logical = want.logical_shape;
  bool sliced = !want_whole;  // whole on both sides: nothing to assemble (another model)
  if (want_whole)  // the stored slices' logical shape, when any is a slice
    for (const Stored& s : stored) {
      const Slice& have = s.shard->slices[s.index];
      if (!is_whole(have, s.shard->header.tensors[s.index].shape)) {
        logical = have.logical_shape;
        sliced = true;
        break;
      }
    }
  if (!sliced || volume(logical) != volume(want.logical_shape)) return false;
  const Box mine = want_whole ? Box{std::vector<int64_t>(logical.size(), 0), logical}
                              : box_of(want, v.view->shape);
  int64_t covered = 0;
  for (const Stored& s : stored) {
    const Slice& have = s.shard->slices[s.index];
    const std::vector<int64_t>& shape = s.shard->header.tensors[s.index].shape;
    Box box;
    if (have.logical_shape == logical)
      box = box_of(have, shape);
    else if (is_whole(have, shape) && volume(shape) == volume(logical))
      box = {std::vector<int64_t>(logical.size(), 0), logical};
    else
      continue;
    const int64_t n = overlap(box, mine);
    if (n == 0) continue;
    // The same block again is a replica (a tensor TP does not split, written by every TP rank):
    // one copy serves.
    if (std::any_of(parts.begin(), parts.end(), [&](const Piece& other) {
          return other.stored.lo == box.lo && other.stored.extent == box.extent;
        }))
      continue;
    for (const Piece& other : parts)  // an element stored twice would be counted twice
      if (overlap(other.stored, box) > 0) {
        problem = "tensor " + v.name + " is stored twice, in " + other.shard->name + " and " +
                  s.shard->name + " (overlapping slices)";
        return false;
      }
    parts.push_back({s.shard, s.index, v.view, box, mine});
    covered += n;
  }
  return covered == v.view->numel();
}

// Points each view at the stored tensor that holds exactly its slice, or at the stored tensors
// whose slices together hold it. Returns the first way the checkpoint does not fit the model, or
// "" when it fits.
// A view of another TP layout than the checkpoint's is assembled from the stored slices that
// intersect it (counted in `resharded`).
std::string match_views(std::vector<std::unique_ptr<Shard>>& shards,
                        const std::vector<NamedView>& views, bool check_extra_params,
                        int64_t& resharded) {
  std::map<std::string, std::vector<Stored>> by_name;
  for (auto& shard : shards) {
    for (size_t i = 0; i < shard->header.tensors.size(); ++i) {
      by_name[shard->header.tensors[i].name].push_back({shard.get(), i});
    }
  }
  std::map<std::string, bool> wanted;
  for (const NamedView& v : views) {
    wanted[v.name] = true;
    const auto found = by_name.find(v.name);
    if (found == by_name.end()) {
      return "tensor " + v.name + " is missing (the model expects shape " +
             shape_text(v.view->shape) + ")";
    }
    const Slice want = slice_of(*v.view);
    const Stored* match = nullptr;
    const Stored* same_logical = nullptr;
    for (const Stored& s : found->second) {
      const Slice& have = s.shard->slices[s.index];
      if (have.logical_shape == want.logical_shape && !same_logical) same_logical = &s;
      if (have == want && s.shard->header.tensors[s.index].shape == v.view->shape) {
        match = &s;
        break;
      }
    }
    if (!match) {  // another layout: assembled from every stored slice it intersects
      std::vector<Piece> parts;
      std::string problem;
      if (assemble(v, found->second, parts, problem)) {
        for (Piece& part : parts) part.shard->pieces[part.index].push_back(std::move(part));
        ++resharded;
        continue;
      }
      if (!problem.empty()) return problem;
    }
    if (!same_logical) {  // a different model
      const Stored& s = found->second.front();
      const Slice& have = s.shard->slices[s.index];
      const bool whole = v.view->logical_shape.empty() &&
                         have.logical_shape == s.shard->header.tensors[s.index].shape;
      return "tensor " + v.name + " has " + (whole ? "shape " : "logical shape ") +
             shape_text(have.logical_shape) + " but the model expects " +
             shape_text(want.logical_shape);
    }
    if (!match) {
      const Slice& have = same_logical->shard->slices[same_logical->index];
      return "tensor " + v.name + ": the stored slices (e.g. at " + shape_text(have.offset) +
             " of " + shape_text(have.logical_shape) + ") do not hold all of this rank's slice at " +
             shape_text(want.offset) + " of " + shape_text(want.logical_shape);
    }
    match->shard->targets[match->index] = v.view;
  }
  if (check_extra_params) {
    for (const auto& [name, stored] : by_name) {
      if (name.rfind("param/", 0) == 0 && !wanted.count(name)) {
        return "tensor " + name + " is not in the model";
      }
    }
  }
  return "";
}

// Streams the rest of the shard through its checksum, reading matched tensors straight into
// their views (when `copy`).
void read_shard_data(Shard& shard, bool copy) {
  std::vector<char> scratch;
  for (size_t i = 0; i < shard.header.tensors.size(); ++i) {
    const safetensors::TensorInfo& t = shard.header.tensors[i];
    uint64_t left = t.end - t.begin;
    if (copy && !shard.pieces[i].empty()) {  // resharding: the whole block, then the pieces
      const int64_t n = volume(t.shape);
      if (left != static_cast<uint64_t>(n) * sizeof(float))
        throw Corrupt(shard.name + ": " + t.name + " is not " + std::to_string(n) + " floats");
      std::vector<float> block(static_cast<size_t>(n));
      if (!shard.file->read_exact(block.data(), left)) {
        throw Corrupt(shard.name + ": truncated in " + t.name);
      }
      shard.sha.update(block.data(), left);
      for (const Piece& piece : shard.pieces[i])
        copy_intersection(block.data(), piece.stored, piece.view->data, piece.target);
      continue;
    }
    if (copy && shard.targets[i]) {
      if (!shard.file->read_exact(shard.targets[i]->data, left)) {
        throw Corrupt(shard.name + ": truncated in " + t.name);
      }
      shard.sha.update(shard.targets[i]->data, left);
      continue;
    }
    while (left > 0) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(left, kScratchBytes));
      scratch.resize(std::max(scratch.size(), n));
      if (!shard.file->read_exact(scratch.data(), n)) {
        throw Corrupt(shard.name + ": truncated in " + t.name);
      }
      shard.sha.update(scratch.data(), n);
      left -= n;
    }
  }
  const std::string sha = shard.sha.hex_digest();
  if (sha != shard.checksum) {
    throw Corrupt(shard.name + ": checksum mismatch (sha256 " + sha + ", " + kMetadataName +
                  " records " + shard.checksum + ")");
  }
}

// Loads one checkpoint directory. Throws Corrupt for damage, kt::Error when it does not fit the
// model. A mismatch is reported only after the checksums pass, so that damage to a header is
// called damage.
CheckpointMeta load_checkpoint_dir(const std::string& dir, int64_t step,
                                   const std::vector<NamedView>& views, bool check_extra_params) {
  if (!path_exists(dir)) throw Corrupt("the directory is missing");
  const Json doc = parse_metadata_json(read_metadata_text(dir));
  CheckpointMeta meta = decode_metadata(doc, dir, step);
  std::vector<std::unique_ptr<Shard>> shards;
  for (const auto& [name, record] : doc["files"].items()) {
    shards.push_back(open_shard(dir, name, record));
  }
  const std::string mismatch = match_views(shards, views, check_extra_params, meta.resharded);
  for (auto& shard : shards) read_shard_data(*shard, mismatch.empty());
  if (!mismatch.empty()) throw Error("checkpoint " + dir + ": " + mismatch);
  return meta;
}

// Errors of the file system that mean the checkpoint's files are gone or damaged.
bool is_damage(int err) {
  return err == ENOENT || err == ENOTDIR || err == EIO;
}

// The commit point: `latest` names the published checkpoint `name` (write temp, fsync, rename,
// fsync the root); then the old ones go.
void commit_latest(const std::string& root, const std::string& name, int64_t step, int keep) {
  sync_dir(root);
  const std::string latest_tmp = root + "/latest.tmp";
  write_file_synced(latest_tmp, name + "\n");
  rename_path(latest_tmp, root + "/latest");
  sync_dir(root);
  remove_old_checkpoints(root, step, keep);
}

// Publishes the finished `tmp` as `final_dir` and commits it. When the commit fails (a full disk
// can fail the small `latest` after the large shards), a step directory that is new goes again:
// uncommitted, the loader would only skip it, and it holds space the next save needs.
void publish_and_commit(const std::string& tmp, const std::string& final_dir,
                        const std::string& root, int64_t step, int keep) {
  const bool existed = path_exists(final_dir);
  const std::string name = fs::path(final_dir).filename().string();
  try {
    publish_dir(tmp, final_dir, root);
  } catch (const Error&) {
    remove_tree(tmp);
    throw;
  }
  try {
    commit_latest(root, name, step, keep);
  } catch (const Error&) {
    std::string latest;
    try {
      latest = api::read_file(root + "/latest");
    } catch (const Error&) {
    }
    if (!existed && latest != name + "\n") {
      const std::string retired = root + "/" + kTmpPrefix + "retired-" + name + "-" + pid_text();
      if (::rename(final_dir.c_str(), retired.c_str()) == 0) remove_tree(retired);
    }
    throw;
  }
}

// metadata.json: the run's state and every shard file with its size and SHA-256.
Json metadata_document(const CheckpointMeta& meta, const Json& files) {
  return {{"format", kFormat},
          {"step", meta.step},
          {"dataCursor", meta.data_cursor},
          {"rng", meta.rng},
          {"planHash", meta.plan_hash},
          {"loss", std::isfinite(meta.loss) ? Json(meta.loss) : Json(nullptr)},
          {"extra", meta.extra},
          {"checksumAlgorithm", "sha256"},
          {"files", files}};
}

}  // namespace

// ---- checkpoints --------------------------------------------------------------------------------

std::string save_checkpoint(const std::string& root, const CheckpointMeta& meta,
                            const CheckpointTensors& tensors, int keep) {
  if (keep < 1) throw Error("checkpoint keep must be at least 1, got " + std::to_string(keep));
  if (meta.step < 0) throw Error("checkpoint step must be >= 0, got " + std::to_string(meta.step));
  const std::vector<NamedView> views = named_views(tensors);
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw IoError("cannot create " + root + ": " + ec.message(), ec.value());

  const std::string name = step_dir_name(meta.step);
  const std::string tmp = root + "/" + kTmpPrefix + name + "-" + pid_text();
  const std::string final_dir = root + "/" + name;
  try {
    fs::remove_all(tmp, ec);  // left by an earlier failed save of this process
    if (::mkdir(tmp.c_str(), 0755) != 0) throw_io_error("create", tmp);
    const WrittenFile shard = write_shard(tmp + "/" + kShardName, views);
    const Json doc = metadata_document(
        meta, {{kShardName, {{"bytes", shard.bytes}, {"checksum", shard.sha256}}}});
    write_file_synced(tmp + "/" + kMetadataName, doc.dump(2) + "\n");
    sync_dir(tmp);
  } catch (const Error&) {
    fs::remove_all(tmp, ec);
    throw;
  }
  publish_and_commit(tmp, final_dir, root, meta.step, keep);
  return final_dir;
}

std::string save_checkpoint(const std::string& root, const CheckpointMeta& meta,
                            const CheckpointTensors& tensors, int keep, const ShardedSave& save) {
  if (save.shard_count == 1 && save.writes && save.more.empty() && save.leader && !save.barrier)
    return save_checkpoint(root, meta, tensors, keep);
  if (keep < 1) throw Error("checkpoint keep must be at least 1, got " + std::to_string(keep));
  if (!save.barrier) throw Error("a sharded checkpoint needs a barrier over the job's ranks");
  const std::string name = step_dir_name(meta.step);
  // Deterministic (no pid): every rank must find the same directory.
  const std::string tmp = root + "/" + kTmpPrefix + name + "-sharded";
  const std::string final_dir = root + "/" + name;
  std::error_code ec;
  // This rank's first failure; the later phases are skipped, the barriers are not.
  std::exception_ptr failure;
  auto phase = [&failure](const std::function<void()>& work) {
    if (failure) return;
    try {
      work();
    } catch (const std::exception&) {
      failure = std::current_exception();
    }
  };
  if (save.leader) phase([&] {
    fs::create_directories(root, ec);
    if (ec) throw IoError("cannot create " + root + ": " + ec.message(), ec.value());
    fs::remove_all(tmp, ec);
    if (::mkdir(tmp.c_str(), 0755) != 0) throw_io_error("create", tmp);
    sync_dir(root);
  });
  save.barrier();  // the directory exists
  auto write = [&](int index, const CheckpointTensors& part) {
    phase([&] {
      char shard_name[64], info_name[64];
      std::snprintf(shard_name, sizeof shard_name, "rank-%05d.safetensors", index);
      std::snprintf(info_name, sizeof info_name, "rank-%05d.json", index);
      const WrittenFile shard = write_shard(tmp + "/" + shard_name, named_views(part));
      const Json info = {{"bytes", shard.bytes}, {"checksum", shard.sha256}};
      write_file_synced(tmp + "/" + info_name, info.dump() + "\n");
    });
  };
  if (save.writes) write(save.shard_index, tensors);
  for (const auto& [index, part] : save.more) write(index, part);
  save.barrier();  // every shard is on disk
  if (save.leader) phase([&] {
    Json files = Json::object();
    for (int i = 0; i < save.shard_count; ++i) {
      char shard[64], info[64];
      std::snprintf(shard, sizeof shard, "rank-%05d.safetensors", i);
      std::snprintf(info, sizeof info, "rank-%05d.json", i);
      const std::string info_path = tmp + "/" + info;
      if (!path_exists(info_path))
        throw Error("checkpoint " + tmp + ": shard " + shard + " is missing");
      files[shard] = Json::parse(api::read_file(info_path));
      fs::remove(info_path, ec);
    }
    const Json doc = metadata_document(meta, files);
    write_file_synced(tmp + "/" + kMetadataName, doc.dump(2) + "\n");
    sync_dir(tmp);
    publish_and_commit(tmp, final_dir, root, meta.step, keep);
  });
  if (failure && save.leader) remove_tree(tmp);
  // Committed (or not, everywhere).
  const bool all_ok = save.all_ok ? save.all_ok(!failure) : (save.barrier(), true);
  if (failure) std::rethrow_exception(failure);
  if (!all_ok)
    throw Error("checkpoint " + name + " was not written: another rank's part of it failed");
  return final_dir;
}

LatestPointer parse_latest_pointer(std::string_view text) {
  if (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  LatestPointer pointer;
  pointer.step = parse_step_dir_name(std::string(text));
  if (!pointer.step) {
    pointer.problem = "it holds " + json_quoted(std::string(text)) + ", not a step directory name";
  }
  return pointer;
}

CheckpointMeta parse_checkpoint_metadata(std::string_view text, const std::string& dir,
                                         int64_t step) {
  return decode_metadata(parse_metadata_json(text), dir, step);
}

CheckpointLock CheckpointLock::acquire(const std::string& root, std::chrono::milliseconds wait) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw IoError("cannot create " + root + ": " + ec.message(), ec.value());
  const std::string path = root + "/.lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw_io_error("open", path);
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EINTR) continue;
    if (err != EWOULDBLOCK || std::chrono::steady_clock::now() >= deadline) {
      char holder[128] = {};
      const ssize_t n = ::pread(fd, holder, sizeof holder - 1, 0);
      ::close(fd);
      if (err != EWOULDBLOCK) throw_io_error("lock", path, err);
      std::string who(holder, n > 0 ? static_cast<size_t>(n) : 0);
      while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
      throw Error("checkpoint directory " + root + " is in use by another writer (" +
                  (who.empty() ? std::string("its lock file ") + path + " is held"
                               : "held by " + json_quoted(who)) +
                  "): two jobs must not share a checkpoint directory; give this one its own "
                  "(spec.checkpoint.volume, --checkpoint-dir) or stop the other");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string who = "pid " + pid_text() + " on " + host + "\n";
  // Best effort: the lock, not this text, is what excludes the other writer.
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, who.data(), who.size(), 0) < 0) {
    warn("cannot record the holder in " + path + ": " + std::strerror(errno));
  }
  return CheckpointLock(fd);
}

CheckpointLock::~CheckpointLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

std::optional<CheckpointMeta> load_latest_checkpoint(const std::string& root,
                                                     const CheckpointTensors& tensors) {
  const std::vector<NamedView> views = named_views(tensors);
  if (!path_exists(root)) return std::nullopt;
  const auto steps = list_step_dirs(root);

  // `latest` names the committed checkpoint; older ones are the fallbacks.
  std::vector<std::pair<int64_t, std::string>> candidates;  // newest first
  std::vector<std::string> failures;
  std::optional<int64_t> pointed;
  const std::string latest = root + "/latest";
  std::error_code regular_error;
  if (path_exists(latest) && !fs::is_regular_file(latest, regular_error)) {
    // A FIFO would block the open (and SIGTERM with it); a device or directory is no pointer.
    warn("checkpoint pointer " + latest + " is not a regular file; trying the newest step " +
         "directory");
    failures.push_back(latest + " (not a regular file)");
  } else if (path_exists(latest)) {
    CheckedFile file(latest, O_RDONLY | O_NONBLOCK);
    std::string text(std::min<uint64_t>(file.size(), 64), '\0');
    text.resize(file.read_exact(text.data(), text.size()) ? text.size() : 0);
    const LatestPointer pointer = parse_latest_pointer(text);
    pointed = pointer.step;
    if (!pointed) {
      const std::string& why = pointer.problem;
      warn("checkpoint pointer " + latest + " is corrupt (" + why + "); trying the newest step " +
           "directory");
      failures.push_back(latest + " (" + why + ")");
    }
  }
  if (pointed) candidates.emplace_back(*pointed, root + "/" + step_dir_name(*pointed));
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (!pointed || it->first < *pointed) {
      candidates.emplace_back(*it);
    } else if (it->first > *pointed) {
      warn("ignoring checkpoint " + it->second + ": it is newer than " + latest +
           " (an interrupted save or an abandoned run)");
    }
  }
  if (candidates.empty() && failures.empty()) return std::nullopt;

  for (size_t i = 0; i < candidates.size(); ++i) {
    const auto& [step, dir] = candidates[i];
    std::string why;
    try {
      return load_checkpoint_dir(dir, step, views, !tensors.params.empty());
    } catch (const Corrupt& e) {
      why = e.what();
    } catch (const IoError& e) {
      if (!is_damage(e.err())) throw;
      why = e.what();
    }
    const bool last = i + 1 == candidates.size();
    warn("checkpoint " + dir + " is corrupt (" + why + "); " +
         (last ? "no previous one is left" : "trying the previous one"));
    failures.push_back(dir + " (" + why + ")");
  }
  std::string list;
  for (const std::string& f : failures) list += (list.empty() ? "" : "; ") + f;
  throw Error("no valid checkpoint under " + root + ", all are corrupt: " + list +
              " (move them away to start from scratch)");
}

}  // namespace kt::worker
