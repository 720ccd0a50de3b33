// Checkpoints (worker/checkpoint.h), the safetensors format (worker/safetensors.h) and llm.c model
// files (worker/llmc_file.h): round trips, retention, crash and corruption handling, and the
// files' layout checked against the formats' specifications with parsers written here.
#include "worker/checkpoint.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "api/error.h"
#include "tests/support/barrier.h"
#include "tests/support/random.h"
#include "worker/llmc_file.h"
#include "worker/safetensors.h"

namespace kt::worker {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

// ---- helpers ------------------------------------------------------------------------------------

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

std::string sha256_hex(const std::string& bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr);
  std::string hex;
  char byte[3];
  for (unsigned int i = 0; i < length; ++i) {
    std::snprintf(byte, sizeof byte, "%02x", digest[i]);
    hex += byte;
  }
  return hex;
}

std::set<std::string> entries(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

// memcmp, which must not see null pointers, even for 0 bytes.
bool same_bytes(const void* a, const void* b, size_t bytes) {
  return bytes == 0 || std::memcmp(a, b, bytes) == 0;
}

// The message of the kt::Error that `f` throws ("" when it throws none).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<int64_t> logical_shape = {};
  std::vector<int64_t> offset = {};
};

// A whole tensor, a 3-D one, a tensor-parallel slice (rows 8..15 of a (16, 4) weight), a vector
// and an empty one.
std::vector<TensorSpec> model_specs() {
  return {{"wte", {10, 4}},
          {"h.0.qkvw", {2, 12, 4}},
          {"h.0.fcw", {8, 4}, {16, 4}, {8, 0}},
          {"lnfw", {4}},
          {"empty", {0, 3}}};
}

// Tensors with their own storage: params, AdamW m and v.
struct TestModel {
  std::vector<std::vector<float>> storage;
  CheckpointTensors tensors;

  explicit TestModel(const std::vector<TensorSpec>& specs, bool with_moments = true) {
    const int groups = with_moments ? 3 : 1;
    storage.reserve(specs.size() * groups);
    for (int g = 0; g < groups; ++g) {
      std::vector<TensorView>& views =
          g == 0 ? tensors.params : (g == 1 ? tensors.adam_m : tensors.adam_v);
      for (const TensorSpec& s : specs) {
        TensorView v{s.name, s.shape, nullptr, s.logical_shape, s.offset};
        storage.emplace_back(static_cast<size_t>(v.numel()), 0.0f);
        v.data = storage.back().data();
        views.push_back(v);
      }
    }
  }
  // Random bit patterns: NaNs with payloads, infinities, denormals and -0 must all survive.
  void randomize(std::mt19937& rng) {
    std::uniform_int_distribution<uint32_t> bits;
    for (auto& tensor : storage) {
      for (float& x : tensor) {
        const uint32_t b = bits(rng);
        std::memcpy(&x, &b, sizeof x);
      }
    }
  }
  bool bit_identical(const TestModel& other) const {
    if (storage.size() != other.storage.size()) return false;
    for (size_t i = 0; i < storage.size(); ++i) {
      if (storage[i].size() != other.storage[i].size() ||
          !same_bytes(storage[i].data(), other.storage[i].data(), storage[i].size() * 4)) {
        return false;
      }
    }
    return true;
  }
};

CheckpointMeta make_meta(int64_t step, std::mt19937& rng) {
  CheckpointMeta meta;
  meta.step = step;
  meta.data_cursor = {{"epoch", 1}, {"position", step * 64}, {"order", {3, 1, 2}}};
  meta.rng = {{"seed", rng()}, {"calls", step}};
  meta.plan_hash = "plan-" + std::to_string(rng());
  meta.loss = std::uniform_real_distribution<double>(0.5, 11.0)(rng);
  meta.extra = {{"model", {{"C", 4}, {"L", 1}}}, {"world", {{"tp", 2}, {"dp", 1}}}};
  return meta;
}

// Each test draws from its own seeded generator; the seed is printed when a test fails and can be
// fixed with KT_TEST_SEED.
class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = test::fresh_seed();
    rng_.seed(seed_);
    std::string pattern = ::testing::TempDir() + "kt_checkpoint_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    root_ = dir_ + "/ckpt";
  }
  void TearDown() override {
    if (HasFailure()) std::cerr << "random seed: " << seed_ << " (KT_TEST_SEED=" << seed_ << ")\n";
    fs::remove_all(dir_);
  }

  std::string step_dir(int64_t step) const {
    char name[32];
    std::snprintf(name, sizeof name, "/step-%08lld", static_cast<long long>(step));
    return root_ + name;
  }
  std::string shard(int64_t step) const { return step_dir(step) + "/rank-00000.safetensors"; }

  // Saves a fresh random model at `step`; returns it.
  std::unique_ptr<TestModel> save_random(int64_t step, int keep = 3) {
    auto model = std::make_unique<TestModel>(model_specs());
    model->randomize(rng_);
    save_checkpoint(root_, make_meta(step, rng_), model->tensors, keep);
    return model;
  }

  void flip_byte(const std::string& path, uint64_t position) {
    std::string bytes = read_file(path);
    bytes[position] = static_cast<char>(bytes[position] ^ 0xff);
    write_file(path, bytes);
  }

  uint32_t seed_ = 0;
  std::mt19937 rng_;
  std::string dir_, root_;
};

// ---- round trip, retention, latest --------------------------------------------------------------

TEST_F(CheckpointTest, SaveThenLoad_RestoresBitIdenticalTensorsAndMeta) {
  TestModel saved(model_specs());
  saved.randomize(rng_);
  const CheckpointMeta meta = make_meta(120, rng_);
  EXPECT_EQ(save_checkpoint(root_, meta, saved.tensors, 3), root_ + "/step-00000120");

  TestModel loaded(model_specs());
  const auto got = load_latest_checkpoint(root_, loaded.tensors);
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(saved.bit_identical(loaded));
  EXPECT_EQ(got->step, 120);
  EXPECT_EQ(got->data_cursor, meta.data_cursor);
  EXPECT_EQ(got->rng, meta.rng);
  EXPECT_EQ(got->plan_hash, meta.plan_hash);
  EXPECT_EQ(got->loss, meta.loss);  // exactly: JSON numbers round-trip doubles
  EXPECT_EQ(got->extra, meta.extra);
}

TEST_F(CheckpointTest, LoadWithoutMoments_RestoresTheParams) {
  const auto saved = save_random(5);
  TestModel loaded(model_specs(), /*with_moments=*/false);
  ASSERT_TRUE(load_latest_checkpoint(root_, loaded.tensors).has_value());
  for (size_t i = 0; i < loaded.storage.size(); ++i) {
    EXPECT_TRUE(same_bytes(loaded.storage[i].data(), saved->storage[i].data(),
                           loaded.storage[i].size() * 4));
  }
}

TEST_F(CheckpointTest, KeepTwo_LeavesTheTwoNewestAndLatestNamesTheNewest) {
  std::unique_ptr<TestModel> last;
  for (int64_t step : {10, 20, 30, 40}) last = save_random(step, /*keep=*/2);
  EXPECT_EQ(entries(root_), (std::set<std::string>{"latest", "step-00000030", "step-00000040"}));
  EXPECT_EQ(read_file(root_ + "/latest"), "step-00000040\n");
  EXPECT_EQ(entries(step_dir(40)),
            (std::set<std::string>{"metadata.json", "rank-00000.safetensors"}));

  TestModel loaded(model_specs());
  EXPECT_EQ(load_latest_checkpoint(root_, loaded.tensors)->step, 40);
  EXPECT_TRUE(last->bit_identical(loaded));
}

TEST_F(CheckpointTest, ResavingAStep_ReplacesIt) {
  save_random(10);
  const auto second = save_random(10);
  EXPECT_EQ(entries(root_), (std::set<std::string>{"latest", "step-00000010"}));
  TestModel loaded(model_specs());
  EXPECT_EQ(load_latest_checkpoint(root_, loaded.tensors)->step, 10);
  EXPECT_TRUE(second->bit_identical(loaded));
}

TEST_F(CheckpointTest, MissingOrEmptyRoot_LoadsNothing) {
  TestModel model(model_specs());
  EXPECT_FALSE(load_latest_checkpoint(root_, model.tensors).has_value());
  fs::create_directories(root_);
  EXPECT_FALSE(load_latest_checkpoint(root_, model.tensors).has_value());
}

TEST_F(CheckpointTest, NoLatestPointer_LoadsTheNewestValidStepDirectory) {
  save_random(10);
  const auto second = save_random(20);
  save_random(30);
  fs::remove(root_ + "/latest");
  flip_byte(shard(30), fs::file_size(shard(30)) - 1);
  TestModel loaded(model_specs());
  ::testing::internal::CaptureStderr();
  const auto got = load_latest_checkpoint(root_, loaded.tensors);
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->step, 20);
  EXPECT_TRUE(second->bit_identical(loaded));
  EXPECT_NE(err.find(step_dir(30) + " is corrupt"), std::string::npos) << err;
}

// ---- corruption ---------------------------------------------------------------------------------

TEST_F(CheckpointTest, AnyCorruptByteInTheNewestShard_FallsBackToThePreviousAndSaysSo) {
  const auto previous = save_random(10);
  for (int trial = 0; trial < 24; ++trial) {
    save_random(20);
    const std::string bytes = read_file(shard(20));
    uint64_t header_end = 8;
    for (int i = 0; i < 8; ++i) header_end += uint64_t{uint8_t(bytes[i])} << (8 * i);
    // Half the trials hit the length or the JSON header, half anywhere.
    const uint64_t limit = trial % 2 ? bytes.size() : header_end;
    const uint64_t position = std::uniform_int_distribution<uint64_t>(0, limit - 1)(rng_);
    SCOPED_TRACE("flipped byte " + std::to_string(position) + " of " +
                 std::to_string(bytes.size()));
    flip_byte(shard(20), position);

    TestModel loaded(model_specs());
    ::testing::internal::CaptureStderr();
    const auto got = load_latest_checkpoint(root_, loaded.tensors);
    const std::string err = ::testing::internal::GetCapturedStderr();
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(got->step, 10);
    EXPECT_TRUE(previous->bit_identical(loaded));
    EXPECT_EQ(err.rfind("kubetrain-worker: checkpoint " + step_dir(20) + " is corrupt (", 0), 0u)
        << err;
    EXPECT_NE(err.find("); trying the previous one\n"), std::string::npos) << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  }
}

TEST_F(CheckpointTest, TruncatedShard_IsDetectedAndSkipped) {
  const auto previous = save_random(10);
  save_random(20);
  const uint64_t size = fs::file_size(shard(20));
  fs::resize_file(shard(20), std::uniform_int_distribution<uint64_t>(0, size - 1)(rng_));
  TestModel loaded(model_specs());
  ::testing::internal::CaptureStderr();
  const auto got = load_latest_checkpoint(root_, loaded.tensors);
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->step, 10);
  EXPECT_TRUE(previous->bit_identical(loaded));
  EXPECT_NE(err.find("truncated"), std::string::npos) << err;
}

TEST_F(CheckpointTest, AllCorrupt_ThrowsListingEachInsteadOfStartingOver) {
  save_random(10);
  save_random(20);
  fs::resize_file(shard(10), 100);
  flip_byte(shard(20), fs::file_size(shard(20)) - 1);  // in the data: only the checksum sees it
  TestModel loaded(model_specs());
  ::testing::internal::CaptureStderr();
  const std::string message = error_of([&] { load_latest_checkpoint(root_, loaded.tensors); });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(message.find("no valid checkpoint under " + root_), std::string::npos) << message;
  EXPECT_NE(message.find(step_dir(10) + " ("), std::string::npos) << message;
  EXPECT_NE(message.find(step_dir(20) + " ("), std::string::npos) << message;
  EXPECT_NE(message.find("checksum mismatch"), std::string::npos) << message;
  EXPECT_NE(message.find("truncated"), std::string::npos) << message;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 2) << err;
}

TEST_F(CheckpointTest, LatestNamingAMissingDirectory_FallsBack) {
  save_random(10);
  save_random(20);
  fs::remove_all(step_dir(20));
  TestModel loaded(model_specs());
  ::testing::internal::CaptureStderr();
  const auto got = load_latest_checkpoint(root_, loaded.tensors);
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->step, 10);
  EXPECT_NE(err.find(step_dir(20) + " is corrupt (the directory is missing)"), std::string::npos)
      << err;
}

// `latest` holds whatever a damaged disk or a careless edit left: bytes that are not UTF-8, NULs,
// binary noise. Each falls back to the newest step directory, like any other bad pointer.
TEST_F(CheckpointTest, LatestWithBytesThatAreNotUtf8_FallsBackLikeOtherCorruption) {
  save_random(10);
  const auto newest = save_random(20);
  for (const std::string& garbage :
       {std::string("step-0000\xff\xfe\n"), std::string("\xc0\x80", 2),
        std::string("step-\0\x01\x80\x9f", 9), std::string(64, '\xff')}) {
    write_file(root_ + "/latest", garbage);
    TestModel loaded(model_specs());
    ::testing::internal::CaptureStderr();
    std::optional<CheckpointMeta> got;
    EXPECT_NO_THROW(got = load_latest_checkpoint(root_, loaded.tensors));
    const std::string err = ::testing::internal::GetCapturedStderr();
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(got->step, 20);
    EXPECT_TRUE(loaded.bit_identical(*newest));
    EXPECT_NE(err.find(root_ + "/latest is corrupt (it holds \""), std::string::npos) << err;
  }
}

TEST_F(CheckpointTest, TamperedMetadata_IsCorrupt) {
  save_random(10);
  save_random(20);
  Json doc = Json::parse(read_file(step_dir(20) + "/metadata.json"));
  doc["files"]["rank-00000.safetensors"]["checksum"] = std::string(64, '0');
  write_file(step_dir(20) + "/metadata.json", doc.dump());
  TestModel loaded(model_specs());
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(load_latest_checkpoint(root_, loaded.tensors)->step, 10);
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("checksum mismatch"), std::string::npos);

  write_file(step_dir(20) + "/metadata.json", "{\"step\": 2");
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(load_latest_checkpoint(root_, loaded.tensors)->step, 10);
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("metadata.json is not valid JSON"),
            std::string::npos);
}

// A slice whose block would reach past its logical tensor ([8,4] at row 9 of [16,4]) is damage:
// the loader falls back to the previous checkpoint and says what is wrong.
TEST_F(CheckpointTest, SliceMetadataOutsideItsTensor_IsCorrupt) {
  save_random(10);
  save_random(20);
  std::string bytes = read_file(shard(20));
  const std::string from = "offset\\\":[8,0]", to = "offset\\\":[9,0]";
  const size_t at = bytes.find(from);
  ASSERT_NE(at, std::string::npos) << "the slice metadata of h.0.fcw";
  bytes.replace(at, from.size(), to);
  write_file(shard(20), bytes);
  Json doc = Json::parse(read_file(step_dir(20) + "/metadata.json"));
  doc["files"]["rank-00000.safetensors"]["checksum"] = sha256_hex(bytes);  // not a bad checksum
  write_file(step_dir(20) + "/metadata.json", doc.dump());
  TestModel loaded(model_specs());
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(load_latest_checkpoint(root_, loaded.tensors)->step, 10);
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("does not place its [8,4] block in its tensor"), std::string::npos) << said;
}

// ---- the model does not fit ---------------------------------------------------------------------

TEST_F(CheckpointTest, ShapeMismatch_ThrowsNamingTheTensor) {
  save_random(7);
  auto specs = model_specs();
  specs[1].shape = {2, 12, 8};
  TestModel other(specs);
  EXPECT_EQ(error_of([&] { load_latest_checkpoint(root_, other.tensors); }),
            "checkpoint " + step_dir(7) +
                ": tensor param/h.0.qkvw has shape [2,12,4] but the model expects [2,12,8]");
}

TEST_F(CheckpointTest, MissingOrExtraTensor_ThrowsNamingIt) {
  save_random(7);
  auto more = model_specs();
  more.push_back({"h.1.qkvw", {2, 12, 4}});
  TestModel bigger(more);
  EXPECT_EQ(error_of([&] { load_latest_checkpoint(root_, bigger.tensors); }),
            "checkpoint " + step_dir(7) +
                ": tensor param/h.1.qkvw is missing (the model expects shape [2,12,4])");

  auto fewer = model_specs();
  fewer.erase(fewer.begin() + 3);  // lnfw
  TestModel smaller(fewer);
  EXPECT_EQ(error_of([&] { load_latest_checkpoint(root_, smaller.tensors); }),
            "checkpoint " + step_dir(7) + ": tensor param/lnfw is not in the model");
}

// Only rows 8..15 are stored; rows 0..7 are nowhere in the checkpoint.
TEST_F(CheckpointTest, ASliceTheStoredSlicesDoNotHold_ThrowsNamingTheTensor) {
  save_random(7);
  auto specs = model_specs();
  specs[2].offset = {0, 0};  // the other tensor-parallel rank's rows
  TestModel other(specs);
  const std::string message = error_of([&] { load_latest_checkpoint(root_, other.tensors); });
  EXPECT_NE(message.find("tensor param/h.0.fcw: the stored slices (e.g. at [8,0] of [16,4]) do "
                         "not hold all of this rank's slice at [0,0] of [16,4]"),
            std::string::npos)
      << message;
}

// ---- the files on disk --------------------------------------------------------------------------

// Parsed here from the safetensors specification, independently of worker/safetensors.cpp.
TEST_F(CheckpointTest, Shard_IsSafetensorsWithSliceMetadata) {
  const auto model = save_random(3);
  const std::string bytes = read_file(shard(3));
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{uint8_t(bytes[i])} << (8 * i);
  ASSERT_LE(8 + n, bytes.size());
  EXPECT_EQ(n % 8, 0u) << "the data block starts 8-byte aligned";
  const std::string text = bytes.substr(8, n);
  ASSERT_EQ(text.front(), '{');
  const size_t close = text.rfind('}');
  EXPECT_EQ(text.find_first_not_of(' ', close + 1), std::string::npos) << "pad with spaces";
  const Json header = Json::parse(text);
  const std::string data = bytes.substr(8 + n);

  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  std::set<std::string> names;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    names.insert(name);
    EXPECT_EQ(entry["dtype"], "F32") << name;
    const auto shape = entry["shape"].get<std::vector<int64_t>>();
    const auto offsets = entry["data_offsets"].get<std::vector<uint64_t>>();
    ASSERT_EQ(offsets.size(), 2u);
    uint64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    EXPECT_EQ(offsets[1] - offsets[0], numel * 4) << name;
    ranges.push_back({offsets[0], offsets[1]});
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t end = 0;
  for (const auto& [b, e] : ranges) {
    EXPECT_EQ(b, end) << "no overlap, no gap";
    end = e;
  }
  EXPECT_EQ(end, data.size());

  const Json& metadata = header["__metadata__"];
  for (const auto& [key, value] : metadata.items()) EXPECT_TRUE(value.is_string()) << key;
  const char* prefixes[] = {"param/", "adam_m/", "adam_v/"};
  for (int g = 0; g < 3; ++g) {
    const auto& views =
        g == 0 ? model->tensors.params : (g == 1 ? model->tensors.adam_m : model->tensors.adam_v);
    for (const TensorView& v : views) {
      const std::string name = prefixes[g] + v.name;
      ASSERT_TRUE(names.count(name)) << name;
      EXPECT_EQ(header[name]["shape"].get<std::vector<int64_t>>(), v.shape);
      const uint64_t begin = header[name]["data_offsets"][0];
      EXPECT_TRUE(same_bytes(data.data() + begin, v.data, v.numel() * 4)) << name;
      const Json slice = Json::parse(metadata["slice/" + name].get<std::string>());
      const std::vector<int64_t> logical = v.logical_shape.empty() ? v.shape : v.logical_shape;
      const std::vector<int64_t> offset =
          v.offset.empty() ? std::vector<int64_t>(v.shape.size(), 0) : v.offset;
      EXPECT_EQ(slice, (Json{{"logical_shape", logical}, {"offset", offset}})) << name;
    }
  }
  EXPECT_EQ(names.size(), 3 * model_specs().size());
  EXPECT_EQ(Json::parse(metadata["slice/param/h.0.fcw"].get<std::string>()),
            Json::parse(R"({"logical_shape":[16,4],"offset":[8,0]})"));
}

TEST_F(CheckpointTest, Metadata_RecordsTheStateAndTheShardsSha256) {
  TestModel model(model_specs());
  model.randomize(rng_);
  const CheckpointMeta meta = make_meta(42, rng_);
  save_checkpoint(root_, meta, model.tensors, 1);
  const Json doc = Json::parse(read_file(step_dir(42) + "/metadata.json"));
  const std::string shard_bytes = read_file(shard(42));
  EXPECT_EQ(doc["format"], "kubetrain-checkpoint/v1");
  EXPECT_EQ(doc["step"], 42);
  EXPECT_EQ(doc["dataCursor"], meta.data_cursor);
  EXPECT_EQ(doc["rng"], meta.rng);
  EXPECT_EQ(doc["planHash"], meta.plan_hash);
  EXPECT_EQ(doc["loss"].get<double>(), meta.loss);
  EXPECT_EQ(doc["extra"], meta.extra);
  EXPECT_EQ(doc["checksumAlgorithm"], "sha256");
  const Json& file = doc["files"]["rank-00000.safetensors"];
  EXPECT_EQ(file["bytes"].get<uint64_t>(), shard_bytes.size());
  EXPECT_EQ(file["checksum"], sha256_hex(shard_bytes));
}

// ---- crashes ------------------------------------------------------------------------------------

TEST_F(CheckpointTest, CrashLeftovers_AreIgnoredByLoadAndRemovedByTheNextSave) {
  const auto saved = save_random(10);
  // A save of step 20 that died while writing: a temp directory with a partial shard, and a
  // half-written pointer that was never renamed.
  const std::string tmp = root_ + "/.tmp-step-00000020-99999";
  fs::create_directories(tmp);
  write_file(tmp + "/rank-00000.safetensors", read_file(shard(10)).substr(0, 100));
  write_file(root_ + "/latest.tmp", "step-000");

  TestModel loaded(model_specs());
  ::testing::internal::CaptureStderr();
  const auto got = load_latest_checkpoint(root_, loaded.tensors);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->step, 10);
  EXPECT_TRUE(saved->bit_identical(loaded));

  save_random(20);
  EXPECT_EQ(entries(root_), (std::set<std::string>{"latest", "step-00000010", "step-00000020"}));
}

// A save that died between renaming its directory in and updating `latest`, or a rollback of
// `latest` by an operator: `latest` is the commit point.
TEST_F(CheckpointTest, StepNewerThanLatest_IsIgnoredAndRemovedByTheNextSave) {
  const auto saved = save_random(10);
  save_random(20);
  write_file(root_ + "/latest", "step-00000010\n");
  TestModel loaded(model_specs());
  ::testing::internal::CaptureStderr();
  const auto got = load_latest_checkpoint(root_, loaded.tensors);
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->step, 10);
  EXPECT_TRUE(saved->bit_identical(loaded));
  EXPECT_NE(err.find("ignoring checkpoint " + step_dir(20)), std::string::npos) << err;

  save_random(15);
  EXPECT_EQ(entries(root_), (std::set<std::string>{"latest", "step-00000010", "step-00000015"}));
}

// ---- failed writes, a second writer ------------------------------------------------------------

// A full disk: `latest.tmp` is /dev/full (every write fails with ENOSPC, also for root, with no
// mount needed), so the small commit fails after the shard was written.
TEST_F(CheckpointTest, DiskFull_ThrowsEnospc_KeepsTheCommittedCheckpoint_AndTheNextSaveWorks) {
  const auto committed = save_random(10);
  fs::create_symlink("/dev/full", root_ + "/latest.tmp");
  TestModel model(model_specs());
  model.randomize(rng_);
  try {
    save_checkpoint(root_, make_meta(20, rng_), model.tensors, 3);
    FAIL() << "a save onto a full disk succeeded";
  } catch (const CheckpointIoError& e) {
    EXPECT_EQ(e.err(), ENOSPC) << e.what();
    EXPECT_NE(std::string(e.what()).find(root_ + "/latest.tmp"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_file(root_ + "/latest"), "step-00000010\n");
  EXPECT_FALSE(fs::exists(step_dir(20))) << "an uncommitted step directory holds space";
  TestModel loaded(model_specs());
  const auto got = load_latest_checkpoint(root_, loaded.tensors);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->step, 10);
  EXPECT_TRUE(loaded.bit_identical(*committed));
  fs::remove(root_ + "/latest.tmp");  // space again
  save_checkpoint(root_, make_meta(30, rng_), model.tensors, 3);
  EXPECT_EQ(read_file(root_ + "/latest"), "step-00000030\n");
}

TEST_F(CheckpointTest, SecondWriter_IsRefusedByTheLock_NamingTheHolder_UntilItIsReleased) {
  {
    const CheckpointLock first = CheckpointLock::acquire(root_, std::chrono::milliseconds(0));
    const auto t0 = std::chrono::steady_clock::now();
    const std::string message =
        error_of([&] { CheckpointLock::acquire(root_, std::chrono::milliseconds(300)); });
    EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(300))
        << "it waits for a holder that may be exiting";
    EXPECT_NE(message.find("checkpoint directory " + root_ + " is in use by another writer"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("pid " + std::to_string(::getpid()) + " on "), std::string::npos)
        << message;
  }
  EXPECT_NO_THROW(CheckpointLock::acquire(root_, std::chrono::milliseconds(0)));
  EXPECT_TRUE(entries(root_).count(".lock"));
  save_random(10);  // the lock file is no checkpoint, and no leftover to remove
  EXPECT_TRUE(entries(root_).count(".lock"));
}

TEST_F(CheckpointTest, LockWhereNoDirectoryCanBe_IsAnIoError) {
  write_file(dir_ + "/a-file", "x");
  try {
    CheckpointLock::acquire(dir_ + "/a-file", std::chrono::milliseconds(0));
    FAIL() << "locked a file as a directory";
  } catch (const CheckpointIoError& e) {
    EXPECT_NE(e.err(), 0) << e.what();
  }
}

using test::TimedBarrier;

// Two TP shards; rank 1 cannot write its part. No rank waits forever, every rank throws (so all
// agree the checkpoint does not exist), and the committed one is untouched.
TEST_F(CheckpointTest, ShardedSave_OneRankFails_EveryRankThrows_NoneHangs) {
  const auto committed = save_random(10);
  TimedBarrier barrier(2);
  std::atomic<int> failed{0};
  TestModel shard0(model_specs()), shard1(model_specs());
  shard1.tensors.adam_m[1].shape = {2, 12, 5};  // this rank's write fails
  std::string errors[2];
  auto rank = [&](int r) {
    ShardedSave save;
    save.shard_index = r;
    save.shard_count = 2;
    save.leader = r == 0;
    save.barrier = [&] { barrier.arrive_and_wait(); };
    save.all_ok = [&](bool ok) {
      if (!ok) ++failed;
      barrier.arrive_and_wait();
      const bool all = failed.load() == 0;
      barrier.arrive_and_wait();  // everyone has read the count
      return all;
    };
    errors[r] = error_of([&] {
      save_checkpoint(root_, make_meta(20, rng_), (r == 0 ? shard0 : shard1).tensors, 3, save);
    });
  };
  std::thread other(rank, 1);
  rank(0);
  other.join();
  EXPECT_NE(errors[1].find("does not mirror"), std::string::npos) << errors[1];
  EXPECT_NE(errors[0].find("rank-00001.safetensors is missing"), std::string::npos) << errors[0];
  EXPECT_EQ(read_file(root_ + "/latest"), "step-00000010\n");
  EXPECT_EQ(entries(root_), (std::set<std::string>{"latest", "step-00000010"}))
      << "the failed save's temporary directory is gone";
}

// ---- bad arguments ------------------------------------------------------------------------------

TEST_F(CheckpointTest, UnwritableRoot_ThrowsNamingThePath) {
  write_file(dir_ + "/a-file", "x");
  TestModel model(model_specs());
  const std::string message = error_of(
      [&] { save_checkpoint(dir_ + "/a-file/ckpt", make_meta(1, rng_), model.tensors, 1); });
  EXPECT_NE(message.find(dir_ + "/a-file/ckpt"), std::string::npos) << message;
  EXPECT_NE(message.find("Not a directory"), std::string::npos) << message;
}

TEST_F(CheckpointTest, BadArguments_Throw) {
  TestModel model(model_specs());
  EXPECT_NE(error_of([&] { save_checkpoint(root_, make_meta(1, rng_), model.tensors, 0); }), "");
  model.tensors.adam_m[1].shape = {2, 12, 5};
  EXPECT_NE(error_of([&] {
              save_checkpoint(root_, make_meta(1, rng_), model.tensors, 1);
            }).find("adam_m/h.0.qkvw [2,12,5] does not mirror param/h.0.qkvw [2,12,4]"),
            std::string::npos);
}

// ---- safetensors --------------------------------------------------------------------------------

std::string decode_error(const std::string& json, uint64_t data_bytes) {
  return error_of([&] { safetensors::decode_header(json, 8 + json.size() + data_bytes, "f"); });
}

TEST(Safetensors, EncodeThenDecode_RoundTrips) {
  const std::string bytes = safetensors::encode_header({{"a", {2, 3}}, {"b", {0}}, {"c", {5}}},
                                                       {{"k", "v"}, {"slice/a", "{}"}});
  ASSERT_EQ(bytes.size() % 8, 0u);
  unsigned char first8[8];
  std::memcpy(first8, bytes.data(), 8);
  const uint64_t file_bytes = bytes.size() + 44;
  const uint64_t n = safetensors::decode_header_length(first8, file_bytes, "f");
  EXPECT_EQ(n, bytes.size() - 8);
  const auto header = safetensors::decode_header(bytes.substr(8, n), file_bytes, "f");
  EXPECT_EQ(header.data_start, bytes.size());
  ASSERT_EQ(header.tensors.size(), 3u);
  EXPECT_EQ(header.tensors[0].name, "a");
  EXPECT_EQ(header.tensors[0].end, 24u);
  EXPECT_EQ(header.tensors[1].name, "b");
  EXPECT_EQ(header.tensors[1].begin, 24u);
  EXPECT_EQ(header.tensors[1].end, 24u);
  EXPECT_EQ(header.tensors[2].name, "c");
  EXPECT_EQ(header.tensors[2].end, 44u);
  EXPECT_EQ(header.metadata.at("k"), "v");
}

TEST(Safetensors, Decode_RejectsMalformedHeaders) {
  const std::string a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":)";
  EXPECT_EQ(decode_error("{" + a + "[0,8]}}", 8), "");
  EXPECT_NE(decode_error(" {" + a + "[0,8]}}", 8).find("does not start with '{'"),
            std::string::npos);
  EXPECT_NE(decode_error("{" + a + "[0,8]}", 8).find("not valid JSON"), std::string::npos);
  EXPECT_NE(decode_error(R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})", 4)
                .find("dtype BF16; only F32"),
            std::string::npos);
  EXPECT_NE(decode_error("{" + a + "[0,16]}}", 8).find("outside the data block"),
            std::string::npos);
  EXPECT_NE(decode_error("{" + a + "[8,0]}}", 8).find("outside the data block"), std::string::npos);
  EXPECT_NE(decode_error("{" + a + "[0,12]}}", 12).find("inconsistent with shape"),
            std::string::npos);
  EXPECT_NE(decode_error(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8)
                .find("bad shape"),
            std::string::npos);
  const std::string b = R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":)";
  EXPECT_NE(decode_error("{" + a + "[0,8]}" + b + "[4,12]}}", 12).find("overlaps"),
            std::string::npos);
  EXPECT_NE(decode_error("{" + a + "[0,8]}" + b + "[12,20]}}", 20).find("gap"), std::string::npos);
  EXPECT_NE(decode_error("{" + a + "[0,8]}}", 12).find("cover 8 bytes"), std::string::npos);
  EXPECT_NE(decode_error(R"({"__metadata__":{"k":1}})", 0).find("is not a string"),
            std::string::npos);
  EXPECT_NE(decode_error(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8).find("no dtype"),
            std::string::npos);
}

TEST(Safetensors, HeaderLength_IsCheckedAgainstTheFile) {
  unsigned char first8[8] = {0x10, 0, 0, 0, 0, 0, 0, 0};  // 16
  EXPECT_EQ(safetensors::decode_header_length(first8, 24, "f"), 16u);
  EXPECT_NE(error_of([&] {
              safetensors::decode_header_length(first8, 23, "f");
            }).find("f: header length 16 exceeds the file size 23"),
            std::string::npos);
  unsigned char huge[8] = {0, 0, 0, 0, 0, 0, 0, 0x80};
  EXPECT_NE(error_of([&] {
              safetensors::decode_header_length(huge, 1 << 20, "f");
            }).find("exceeds the limit"),
            std::string::npos);
  unsigned char zero[8] = {};
  EXPECT_NE(error_of([&] { safetensors::decode_header_length(zero, 100, "f"); }).find("too small"),
            std::string::npos);
}

// ---- llm.c --------------------------------------------------------------------------------------

// llm.c's 16 parameter shapes (train_gpt2.c: fill_in_parameter_sizes), written out here rather
// than taken from worker/gpt_layout.h: the test's own copy of llm.c is the oracle for the table.
std::vector<TensorSpec> llmc_specs(const LlmcDims& d) {
  const int64_t maxT = d.max_seq_len, L = d.num_layers, C = d.channels;
  const int64_t Vp = d.padded_vocab_size;
  return {{"wte", {Vp, C}},
          {"wpe", {maxT, C}},
          {"ln1w", {L, C}},
          {"ln1b", {L, C}},
          {"qkvw", {L, 3 * C, C}},
          {"qkvb", {L, 3 * C}},
          {"attprojw", {L, C, C}},
          {"attprojb", {L, C}},
          {"ln2w", {L, C}},
          {"ln2b", {L, C}},
          {"fcw", {L, 4 * C, C}},
          {"fcb", {L, 4 * C}},
          {"fcprojw", {L, C, 4 * C}},
          {"fcprojb", {L, C}},
          {"lnfw", {C}},
          {"lnfb", {C}}};
}

class LlmcTest : public CheckpointTest {
 protected:
  const LlmcDims dims_{
      /*max_seq_len=*/8, /*vocab_size=*/10, /*num_layers=*/2,
      /*num_heads=*/2,   /*channels=*/4,    /*padded_vocab_size=*/16};
  std::string path() const { return dir_ + "/model.bin"; }

  std::vector<int32_t> header_of(const std::string& bytes) {
    std::vector<int32_t> header(256);
    std::memcpy(header.data(), bytes.data(), 1024);
    return header;
  }
  void write_header(std::vector<int32_t> header, uint64_t floats) {
    std::string bytes(1024 + floats * 4, '\0');
    std::memcpy(bytes.data(), header.data(), 1024);
    write_file(path(), bytes);
  }
};

TEST_F(LlmcTest, ExportThenImport_IsLossless) {
  TestModel model(llmc_specs(dims_), /*with_moments=*/false);
  model.randomize(rng_);
  export_llmc(path(), dims_, model.tensors.params);

  const std::string bytes = read_file(path());
  const auto header = header_of(bytes);
  EXPECT_EQ(std::vector<int32_t>(header.begin(), header.begin() + 8),
            (std::vector<int32_t>{20240326, 3, 8, 10, 2, 2, 4, 16}));
  EXPECT_TRUE(std::all_of(header.begin() + 8, header.end(), [](int32_t x) { return x == 0; }));
  uint64_t offset = 1024;
  for (const auto& tensor : model.storage) {
    EXPECT_TRUE(same_bytes(bytes.data() + offset, tensor.data(), tensor.size() * 4));
    offset += tensor.size() * 4;
  }
  EXPECT_EQ(offset, bytes.size());
  EXPECT_EQ(entries(dir_), std::set<std::string>{"model.bin"}) << "no temp file left";

  const LlmcDims read = read_llmc_dims(path());
  EXPECT_EQ(read.max_seq_len, 8);
  EXPECT_EQ(read.vocab_size, 10);
  EXPECT_EQ(read.num_layers, 2);
  EXPECT_EQ(read.num_heads, 2);
  EXPECT_EQ(read.channels, 4);
  EXPECT_EQ(read.padded_vocab_size, 16);
  TestModel loaded(llmc_specs(dims_), /*with_moments=*/false);
  import_llmc(path(), dims_, loaded.tensors.params);
  EXPECT_TRUE(model.bit_identical(loaded));
}

TEST_F(LlmcTest, BadMagicOrVersion_IsRejected) {
  TestModel model(llmc_specs(dims_), false);
  export_llmc(path(), dims_, model.tensors.params);
  auto header = header_of(read_file(path()));
  const uint64_t floats = (read_file(path()).size() - 1024) / 4;

  header[0] = 20240520;  // a token shard
  write_header(header, floats);
  EXPECT_EQ(error_of([&] { read_llmc_dims(path()); }),
            path() + ": bad magic 20240520, expected 20240326 (llm.c model file)");
  header[0] = 20240326;
  header[1] = 5;
  write_header(header, floats);
  EXPECT_NE(error_of([&] {
              import_llmc(path(), dims_, model.tensors.params);
            }).find("version 5 is llm.c's bf16 model file; only version 3 (fp32) is supported"),
            std::string::npos);
  header[1] = 4;
  write_header(header, floats);
  EXPECT_NE(
      error_of([&] { read_llmc_dims(path()); }).find("unsupported llm.c model file version 4"),
      std::string::npos);
}

TEST_F(LlmcTest, TruncatedFile_IsRejected) {
  TestModel model(llmc_specs(dims_), false);
  export_llmc(path(), dims_, model.tensors.params);
  const uint64_t size = fs::file_size(path());
  fs::resize_file(path(), std::uniform_int_distribution<uint64_t>(1024, size - 1)(rng_));
  EXPECT_NE(error_of([&] { import_llmc(path(), dims_, model.tensors.params); }).find("truncated"),
            std::string::npos);
  fs::resize_file(path(), std::uniform_int_distribution<uint64_t>(0, 1023)(rng_));
  EXPECT_NE(error_of([&] { read_llmc_dims(path()); }).find("truncated"), std::string::npos);
  EXPECT_NE(error_of([&] {
              read_llmc_dims(dir_ + "/none.bin");
            }).find("cannot open " + dir_ + "/none.bin: No such file or directory"),
            std::string::npos);
}

TEST_F(LlmcTest, OtherDimsOrSizes_AreRejected) {
  TestModel model(llmc_specs(dims_), false);
  export_llmc(path(), dims_, model.tensors.params);
  LlmcDims wider = dims_;
  wider.channels = 8;
  TestModel other(llmc_specs(wider), false);
  EXPECT_EQ(error_of([&] { import_llmc(path(), wider, other.tensors.params); }),
            path() + ": the file's dims differ: C=4 (the model has 8)");
  // Tensors that do not match the dims.
  EXPECT_NE(error_of([&] {
              export_llmc(path(), wider, model.tensors.params);
            }).find("tensor wte has shape [16,4] but llm.c's wte is [16,8]"),
            std::string::npos);
  std::vector<TensorView> fifteen(model.tensors.params.begin(), model.tensors.params.end() - 1);
  EXPECT_NE(error_of([&] { export_llmc(path(), dims_, fifteen); }).find("16 parameter tensors"),
            std::string::npos);
}

}  // namespace
}  // namespace kt::worker
