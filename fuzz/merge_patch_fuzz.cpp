// libFuzzer harness: JSON merge patches (RFC 7386) as `kubetrain local serve` applies them to
// stored objects (local/store.h, Store::merge_patch: then admission, the CRD's schema,
// generation and resourceVersion). Input: one byte picking the object (a ConfigMap, a Pod, a
// TrainingJob under the CRD's schema), then the patch as JSON. A patch must apply or be refused
// with ApiError; applied, it must be idempotent: the same patch again is a no-op write that
// keeps the resourceVersion. Whatever metadata it planted, the rest of the store goes on working:
// an object in another namespace can be created, listed and deleted (one malformed
// ownerReferences once made every DELETE answer 400).
//   fuzz/run.sh merge_patch 60
#include <cstddef>
#include <cstdint>
#include <string>

#include "api/error.h"
#include "api/yaml_json.h"
#include "fuzz/fuzz_check.h"
#include "local/store.h"

namespace {

using kt::kube::Object;

struct World {
  kt::local::Store store;
  World() {
    store.create(kt::kube::kCustomResourceDefinitions, "",
                 kt::api::load_document(std::string(KT_SOURCE_DIR) +
                                        "/crds/trainingjobs.kubetrain.dev.yaml"));
  }
};

struct Subject {
  const kt::kube::Resource* resource;
  Object object;
};

Subject subject(uint8_t pick) {
  switch (pick % 3) {
    case 0:
      return {&kt::kube::kConfigMaps, Object::parse(R"({"metadata": {"name": "cm",
        "labels": {"app": "x"}}, "data": {"a": "1", "b": "2"}})")};
    case 1:
      return {&kt::kube::kPods, Object::parse(R"({"metadata": {"name": "p"}, "spec": {
        "containers": [{"name": "c", "image": "i", "command": ["true"]}]}})")};
    default:
      return {&kt::kube::kTrainingJobs, Object::parse(R"({"apiVersion": "kubetrain.dev/v1alpha1",
        "kind": "TrainingJob", "metadata": {"name": "j"}, "spec": {"model": {"preset": "tiny"},
        "training": {"steps": 10}}})")};
  }
}

World& world() {
  static World w;
  return w;
}

// The rest of the store works: a ConfigMap elsewhere is created, listed and deleted.
void check_store_works() {
  kt::local::Store& store = world().store;
  try {
    store.create(kt::kube::kConfigMaps, "elsewhere",
                 Object::parse(R"({"metadata": {"name": "probe"}})"));
    (void)store.list(kt::kube::kConfigMaps, "", {});
    store.remove(kt::kube::kConfigMaps, "elsewhere", "probe");
  } catch (const kt::kube::ApiError& e) {
    FUZZ_CHECK(false, std::string("after a patch the store refuses an unrelated object: ") + e.what());
  }
}

// One input: the patch applied (or refused), then applied again where it must be a no-op.
int patch_once(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  Object patch;
  try {
    patch = kt::api::parse_json(std::string(kt::fuzz::as_text(data + 1, size - 1)), "patch.json");
  } catch (const kt::Error&) {
    return 0;
  }
  const Subject s = subject(data[0]);
  const kt::kube::Resource& r = *s.resource;
  const std::string name = s.object["metadata"]["name"];
  const bool status = (data[0] / 3) % 2 == 1 && r.plural != "configmaps";
  try {
    world().store.remove(r, "default", name);
  } catch (const kt::kube::ApiError&) {
  }
  world().store.create(r, "default", s.object);
  Object first;
  try {
    first = world().store.merge_patch(r, "default", name, patch, status);
  } catch (const kt::kube::ApiError&) {
    return 0;
  }
  (void)first.dump();
  // Owner references that name no existing object: the garbage collector took it at once.
  try {
    world().store.get(r, "default", name);
  } catch (const kt::kube::ApiError& e) {
    FUZZ_CHECK(e.not_found(), std::string("a patched object cannot be read: ") + e.what());
    FUZZ_CHECK(first["metadata"].contains("ownerReferences"),
               "a patched object without owner references vanished:\n" + patch.dump());
    return 0;
  }
  // A resourceVersion in a patch is a precondition: the second time it is stale (409).
  if (patch.contains("metadata") && patch["metadata"].is_object() &&
      patch["metadata"].contains("resourceVersion") &&
      !patch["metadata"]["resourceVersion"].is_null()) {
    return 0;
  }
  Object second;
  try {
    second = world().store.merge_patch(r, "default", name, patch, status);
  } catch (const kt::kube::ApiError& e) {
    FUZZ_CHECK(false, std::string("a patch that applied once is refused the second time: ") +
                          e.what() + "\n" + patch.dump() + "\n" + first.dump());
  }
  FUZZ_CHECK(second == first, "a merge patch is not idempotent:\n" + patch.dump() + "\n" +
                                  first.dump() + "\n" + second.dump());
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int result = patch_once(data, size);
  check_store_works();
  return result;
}
