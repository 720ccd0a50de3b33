#include "api/inventory.h"

#include <cmath>

#include "api/decode.h"
#include "api/error.h"
#include "api/quantity.h"
#include "api/training_job.h"

namespace kt::api {
namespace {

std::string known_products() {
  std::string names;
  for (const auto& p : builtin_profiles()) names += (names.empty() ? "" : ", ") + p.name;
  return names;
}

// Resolves the hardware of a node whose fields are filled in; `product_path` names the field
// the product came from, for the error.
void resolve_hardware(Node& node, const std::string& node_path, const std::string& product_path,
                      double gpu_memory_bytes) {
  const HardwareProfile* profile = nullptr;
  if (node.is_cpu_node()) {
    profile = &cpu_profile();
  } else {
    profile = find_profile(node.gpu_product);
    if (!profile)
      throw FieldError(product_path, "unknown GPU product \"" + node.gpu_product +
                                         "\" with no hardware profile (known: " + known_products() +
                                         ")");
  }
  node.hardware = apply_overrides(apply_cpu_features(*profile, node.labels), node.annotations,
                                  node_path);
  if (gpu_memory_bytes > 0 && !node.is_cpu_node()) node.hardware.memory_bytes = gpu_memory_bytes;
}

// The largest node an inventory may describe: beyond any machine built, and small enough that the
// planner's loops over GPUs and cores per node and its byte counts stay bounded and finite.
constexpr int64_t kMaxGpusPerNode = JobLimits::kGpusPerNode;
constexpr int64_t kMaxCpuCores = 65536;
constexpr int64_t kMaxReplicas = JobLimits::kNodes;
constexpr double kMaxMemoryBytes = 1152921504606846976.0;  // 2^60 bytes, 1 EiB

// An allocatable amount read as a double, checked before it becomes an integer count.
int64_t bounded_count(double value, int64_t max, const std::string& path) {
  if (!(value >= 0) || value > static_cast<double>(max))
    throw FieldError(path, Json(value).dump() + " must be between 0 and " + std::to_string(max));
  return static_cast<int64_t>(std::floor(value));
}

void check_node(const Node& node, const std::string& path) {
  if (node.cpu_cores <= 0)
    throw FieldError(path + ".cpu.cores", std::to_string(node.cpu_cores) + " must be > 0");
  if (node.cpu_cores > kMaxCpuCores)
    throw FieldError(
        path + ".cpu.cores",
        std::to_string(node.cpu_cores) + " exceeds the limit of " + std::to_string(kMaxCpuCores));
  if (node.gpu_count > kMaxGpusPerNode)
    throw FieldError(path + ".gpu.count", std::to_string(node.gpu_count) +
                                              " exceeds the limit of " +
                                              std::to_string(kMaxGpusPerNode));
  if (!(node.memory_bytes > 0)) throw FieldError(path + ".memory", "must be > 0");
  if (!(node.memory_bytes <= kMaxMemoryBytes))
    throw FieldError(path + ".memory", "exceeds the limit of 1Ei");
  if (node.free_gpus < 0 || node.free_gpus > node.gpu_count)
    throw FieldError(path + ".gpu.free", std::to_string(node.free_gpus) +
                                             " must be between 0 and the GPU count " +
                                             std::to_string(node.gpu_count));
}

// Inventory `links:` fields are shorthands for the override annotations.
void links_to_annotations(ObjectReader links, std::map<std::string, std::string>& annotations) {
  const std::pair<const char*, const char*> kKeys[] = {
      {"gpuLink", "kubetrain.dev/gpu-link"},
      {"pcieGBps", "kubetrain.dev/pcie-gbps"},
      {"intraBusbwGBps", "kubetrain.dev/intra-busbw-gbps"},
      {"interNodeGBps", "kubetrain.dev/inter-node-gbps"},
  };
  for (const auto& [field, annotation] : kKeys) {
    if (!links.has(field)) {
      links.raw(field);
      continue;
    }
    Json v = links.raw(field);
    annotations[annotation] = v.is_string() ? v.get<std::string>() : v.dump();
  }
  links.finish();
}

}  // namespace

Inventory decode_inventory(const Json& doc) {
  ObjectReader r(doc, "");
  Inventory inv;
  r.string("apiVersion");
  r.string("kind");
  ObjectReader meta = r.object("metadata");
  inv.name = meta.string("name").value_or("");
  meta.allow_unknown();
  const Json nodes = r.raw("nodes");
  r.finish();
  if (!nodes.is_null() && !nodes.is_array())
    throw FieldError("nodes", "must be a list, got " + describe_json(nodes));
  for (size_t i = 0; nodes.is_array() && i < nodes.size(); ++i) {
    const std::string path = "nodes[" + std::to_string(i) + "]";
    ObjectReader n(nodes[i], path);
    Node node;
    const auto name = n.string("name");
    if (!name || name->empty()) throw FieldError(path + ".name", "required");
    const int64_t replicas = n.integer("replicas").value_or(1);
    if (replicas < 1 || replicas > kMaxReplicas)
      throw FieldError(path + ".replicas", std::to_string(replicas) + " must be between 1 and " +
                                               std::to_string(kMaxReplicas));
    ObjectReader gpu = n.object("gpu");
    node.gpu_product = gpu.string("product").value_or("");
    node.gpu_count = gpu.integer("count").value_or(0);
    if (node.gpu_count < 0)
      throw FieldError(path + ".gpu.count", std::to_string(node.gpu_count) + " must be >= 0");
    if (node.gpu_count > 0 && node.gpu_product.empty())
      throw FieldError(path + ".gpu.product", "required when gpu.count > 0");
    node.free_gpus = gpu.integer("free").value_or(node.gpu_count);
    const double gpu_memory = gpu.quantity_or_auto("memory").value_or(0);
    gpu.finish();
    ObjectReader cpu = n.object("cpu");
    node.cpu_cores = cpu.integer("cores").value_or(0);
    cpu.finish();
    const auto memory = n.quantity_or_auto("memory");
    if (!memory) throw FieldError(path + ".memory", "required (host memory, e.g. 256Gi)");
    node.memory_bytes = *memory;
    node.schedulable = n.boolean("schedulable").value_or(true);
    node.labels = n.string_map("labels");
    node.annotations = n.string_map("annotations");
    links_to_annotations(n.object("links"), node.annotations);
    n.finish();
    check_node(node, path);
    resolve_hardware(node, path, path + ".gpu.product", gpu_memory);
    if (static_cast<int64_t>(inv.nodes.size()) + replicas > kMaxReplicas)
      throw FieldError(path + ".replicas", "the inventory would hold more than " +
                                               std::to_string(kMaxReplicas) + " nodes");
    for (int64_t k = 0; k < replicas; ++k) {
      Node copy = node;
      if (replicas > 1)
        copy.name = *name + "-" + std::to_string(k);
      else
        copy.name = *name;
      inv.nodes.push_back(std::move(copy));
    }
  }
  return inv;
}

bool node_accepts_pods(const Json& node) {
  if (!node.is_object()) return false;
  const Json* status = node.contains("status") ? &node["status"] : nullptr;
  if (status && status->is_object() && status->contains("conditions") &&
      (*status)["conditions"].is_array())
    for (const Json& c : (*status)["conditions"])
      if (c.is_object() && c.value("type", Json()) == "Ready" && c.value("status", Json()) != "True")
        return false;
  const Json* spec = node.contains("spec") ? &node["spec"] : nullptr;
  if (!spec || !spec->is_object()) return true;
  if (spec->value("unschedulable", Json()) == true) return false;
  if (spec->contains("taints") && (*spec)["taints"].is_array())
    for (const Json& t : (*spec)["taints"]) {
      if (!t.is_object()) continue;
      const Json key = t.value("key", Json()), effect = t.value("effect", Json());
      if ((key == "node.kubernetes.io/not-ready" || key == "node.kubernetes.io/unreachable") &&
          (effect == "NoSchedule" || effect == "NoExecute"))
        return false;
    }
  return true;
}

Node decode_kubectl_node(const Json& item, const std::string& path) {
  if (!item.is_object() || (item.contains("kind") && item["kind"] != "Node"))
    throw FieldError(path + ".kind", "must be Node");
  static const Json kNull;
  auto member = [&](const char* key) -> const Json& {
    auto it = item.find(key);
    return it == item.end() ? kNull : *it;
  };
  ObjectReader meta(member("metadata"), path + ".metadata");
  Node node;
  node.name = meta.string("name").value_or("");
  if (node.name.empty()) throw FieldError(path + ".metadata.name", "required");
  node.labels = meta.string_map("labels");
  node.annotations = meta.string_map("annotations");
  meta.allow_unknown();

  ObjectReader status(member("status"), path + ".status");
  ObjectReader alloc = status.object("allocatable");
  alloc.allow_unknown();
  auto quantity = [&](const std::string& key) -> double {
    auto text = alloc.has(key) ? alloc.raw(key) : Json();
    if (text.is_null()) return 0;
    if (text.is_number()) return text.get<double>();
    if (text.is_string()) {
      if (auto q = parse_quantity(text.get<std::string>())) return *q;
    }
    throw FieldError(alloc.path_of(key), "must be a quantity, got " + describe_json(text));
  };
  node.gpu_count =
      bounded_count(quantity("nvidia.com/gpu"), kMaxGpusPerNode, alloc.path_of("nvidia.com/gpu"));
  node.free_gpus = node.gpu_count;
  node.cpu_cores = bounded_count(quantity("cpu"), kMaxCpuCores, alloc.path_of("cpu"));
  node.memory_bytes = quantity("memory");
  status.allow_unknown();
  ObjectReader spec(member("spec"), path + ".spec");
  spec.boolean("unschedulable");  // type-checked here; node_accepts_pods reads it
  spec.allow_unknown();
  node.schedulable = node_accepts_pods(item);

  const std::string label_path = path + ".metadata.labels.";
  double gpu_memory = 0;
  if (node.gpu_count > 0) {
    auto product = node.labels.find("nvidia.com/gpu.product");
    if (product == node.labels.end())
      throw FieldError(label_path + "nvidia.com/gpu.product",
                       "required on a node with nvidia.com/gpu allocatable (GPU Feature "
                       "Discovery sets it)");
    node.gpu_product = product->second;
    auto mem = node.labels.find("nvidia.com/gpu.memory");  // MiB
    if (mem != node.labels.end()) {
      char* end = nullptr;
      const double mib = std::strtod(mem->second.c_str(), &end);
      // At most 16 TiB a GPU (the largest today have 0.2 TiB): a label of 10^20 MiB would
      // otherwise be planned with.
      constexpr double kMaxGpuMemoryMiB = 16.0 * 1024 * 1024;
      if (end == mem->second.c_str() || *end != '\0' || !(mib > 0 && mib <= kMaxGpuMemoryMiB))
        throw FieldError(label_path + "nvidia.com/gpu.memory",
                         "must be MiB as a number from 1 to 16777216, got \"" + mem->second + "\"");
      gpu_memory = mib * kMiB;
    }
  }
  if (node.cpu_cores <= 0)
    throw FieldError(path + ".status.allocatable.cpu", "must be at least 1 core");
  if (!(node.memory_bytes > 0 && node.memory_bytes <= kMaxMemoryBytes))
    throw FieldError(path + ".status.allocatable.memory", "must be > 0 and at most 1Ei");
  resolve_hardware(node, path + ".metadata", label_path + "nvidia.com/gpu.product", gpu_memory);
  return node;
}

Inventory decode_kubectl_nodes(const Json& doc) {
  Inventory inv;
  inv.name = "kubectl";
  const Json* items = doc.contains("items") ? &doc["items"] : nullptr;
  if (!items || !items->is_array()) throw FieldError("items", "must be a list of Nodes");
  inv.nodes.reserve(items->size());
  for (size_t i = 0; i < items->size(); ++i)
    inv.nodes.push_back(decode_kubectl_node((*items)[i], "items[" + std::to_string(i) + "]"));
  return inv;
}

Inventory inventory_from_document(const Json& doc, const std::string& source) {
  if (!doc.is_object()) throw Error(source + ": not a cluster inventory (expected a map)");
  const auto kind_field = doc.find("kind");
  if (kind_field != doc.end() && !kind_field->is_string())
    throw FieldError("kind", "must be a string, got " + describe_json(*kind_field));
  const std::string kind = doc.value("kind", "");
  Inventory inv;
  if (kind == "Inventory")
    inv = decode_inventory(doc);
  else if (kind == "List" || kind == "NodeList")
    inv = decode_kubectl_nodes(doc);
  else
    throw Error(source + ": kind \"" + kind +
                "\" is not a cluster (expected kind: Inventory, or `kubectl get nodes -o json`)");
  if (inv.nodes.empty())
    throw FieldError(kind == "Inventory" ? "nodes" : "items", "the cluster has no nodes");
  if (inv.name.empty()) inv.name = source;
  return inv;
}

Inventory load_inventory(const std::string& path) {
  const Json doc = load_document(path);
  try {
    return inventory_from_document(doc, path);
  } catch (const FieldError& e) {  // the field's path, and the file it is in
    throw Error(path + ": " + e.what());
  }
}

}  // namespace kt::api
