#include "local/store.h"

#include <algorithm>
#include <ctime>
#include <random>

#include "operator/kube/objects.h"
#include "local/builtin_resources.h"
#include "local/builtin_schemas.h"
#include "local/schema.h"
#include "operator/kube/selectors.h"

namespace kt::local {

using kube::ApiError;
using kube::matches_field_selector;
using kube::matches_label_selector;
using kube::Object;
using kube::Resource;
using kube::WatchEventType;

namespace {

std::string kind_key(const Resource& r) {
  return r.group + "/" + r.plural;
}

std::string object_key(const std::string& ns, const std::string& name) {
  return ns + "/" + name;
}

ApiError not_found(const Resource& r, const std::string& name) {
  return ApiError(
      404, "NotFound",
      r.plural + (r.group.empty() ? "" : "." + r.group) + " \"" + name + "\" not found");
}

ApiError invalid(const Resource& r, const std::string& name, const std::string& field,
                 const std::string& why) {
  return ApiError(422, "Invalid", r.kind + " \"" + name + "\" is invalid: " + field + ": " + why);
}

// RFC 1123 subdomain: what the API server requires of most object names.
bool valid_name(const std::string& name) {
  if (name.empty() || name.size() > 253) return false;
  for (char c : name)
    if (!(std::islower(static_cast<unsigned char>(c)) ||
          std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '.'))
      return false;
  auto alnum = [](char c) {
    return std::islower(static_cast<unsigned char>(c)) ||
           std::isdigit(static_cast<unsigned char>(c));
  };
  return alnum(name.front()) && alnum(name.back());
}

// The API server's qualified name (labels', annotations' and finalizers' keys): an optional
// DNS-1123 subdomain prefix and '/', then a name of at most 63 characters of [A-Za-z0-9-_.],
// starting and ending alphanumeric. Empty: valid; otherwise why not.
std::string qualified_name_problem(const std::string& key) {
  std::string name = key;
  if (const auto slash = key.find('/'); slash != std::string::npos) {
    const std::string prefix = key.substr(0, slash);
    name = key.substr(slash + 1);
    if (prefix.empty()) return "prefix part must be non-empty";
    if (!valid_name(prefix)) return "prefix part must be a lowercase RFC 1123 subdomain";
  }
  if (name.empty()) return "name part must be non-empty";
  if (name.size() > 63) return "name part must be no more than 63 characters";
  const auto alnum = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
  for (char c : name)
    if (!alnum(c) && c != '-' && c != '_' && c != '.')
      return "name part must consist of alphanumeric characters, '-', '_' or '.'";
  if (!alnum(name.front()) || !alnum(name.back()))
    return "name part must start and end with an alphanumeric character";
  return "";
}

// A label value: empty, or at most 63 characters of [A-Za-z0-9-_.] starting and ending
// alphanumeric.
bool valid_label_value(const std::string& value) {
  return value.empty() || (value.size() <= 63 && qualified_name_problem(value).empty() &&
                           value.find('/') == std::string::npos);
}

// A rough size of a JSON value in bytes (its text's, within a few per cent), without writing it.
size_t approx_bytes(const Object& v) {
  switch (v.type()) {
    case Object::value_t::object: {
      size_t n = 2;
      for (const auto& [key, item] : v.items()) n += key.size() + 4 + approx_bytes(item);
      return n;
    }
    case Object::value_t::array: {
      size_t n = 2;
      for (const auto& item : v) n += 1 + approx_bytes(item);
      return n;
    }
    case Object::value_t::string: return v.get_ref<const std::string&>().size() + 2;
    default: return 8;
  }
}

// What the API server checks of an object's metadata on every write (apimachinery's
// ValidateObjectMeta): labels and annotations as maps of strings with qualified keys (and label
// values of label form), annotations at most 256 KiB, finalizers qualified names, owner
// references complete, with at most one controller. One malformed field in a stored object
// would otherwise break every reader of it (the garbage collector, a label-indexed informer).
void validate_metadata(const Resource& r, const std::string& name, const Object& meta) {
  const auto string_map = [&](const char* field) {
    if (!meta.contains(field) || meta[field].is_null()) return;
    const std::string path = std::string("metadata.") + field;
    if (!meta[field].is_object()) throw invalid(r, name, path, "must be a map of strings");
    for (const auto& [key, value] : meta[field].items()) {
      if (!value.is_string())
        throw invalid(r, name, path + "." + key, "Invalid value: must be a string");
      std::string checked = key;
      if (std::string(field) == "annotations")
        for (char& c : checked) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (const std::string why = qualified_name_problem(checked); !why.empty())
        throw invalid(r, name, path, "Invalid value: \"" + key + "\": " + why);
    }
  };
  string_map("labels");
  string_map("annotations");
  if (meta.contains("labels") && meta["labels"].is_object())
    for (const auto& [key, value] : meta["labels"].items())
      if (!valid_label_value(value.get<std::string>()))
        throw invalid(r, name, "metadata.labels",
                      "Invalid value: \"" + value.get<std::string>() +
                          "\": a valid label must be an empty string or consist of at most 63 "
                          "alphanumeric characters, '-', '_' or '.', and must start and end "
                          "with an alphanumeric character");
  if (meta.contains("annotations") && meta["annotations"].is_object()) {
    constexpr size_t kAnnotationBytes = 256 * 1024;  // TotalAnnotationSizeLimitB
    size_t total = 0;
    for (const auto& [key, value] : meta["annotations"].items())
      total += key.size() + value.get_ref<const std::string&>().size();
    if (total > kAnnotationBytes)
      throw invalid(r, name, "metadata.annotations",
                    "Too long: must have at most " + std::to_string(kAnnotationBytes) + " bytes");
  }
  if (meta.contains("finalizers") && !meta["finalizers"].is_null()) {
    if (!meta["finalizers"].is_array())
      throw invalid(r, name, "metadata.finalizers", "must be a list of strings");
    for (const auto& finalizer : meta["finalizers"]) {
      if (!finalizer.is_string())
        throw invalid(r, name, "metadata.finalizers", "Invalid value: must be a string");
      const std::string f = finalizer.get<std::string>();
      std::string why = qualified_name_problem(f);
      if (why.empty() && f.find('/') == std::string::npos && f != "kubernetes" && f != "orphan" &&
          f != "foregroundDeletion")
        why = "name is neither a standard finalizer name nor is it fully qualified";
      if (!why.empty())
        throw invalid(r, name, "metadata.finalizers", "Invalid value: \"" + f + "\": " + why);
    }
  }
  if (meta.contains("ownerReferences") && !meta["ownerReferences"].is_null()) {
    const Object& refs = meta["ownerReferences"];
    if (!refs.is_array())
      throw invalid(r, name, "metadata.ownerReferences", "must be a list of owner references");
    int controllers = 0;
    for (size_t i = 0; i < refs.size(); ++i) {
      const std::string path = "metadata.ownerReferences[" + std::to_string(i) + "]";
      const Object& ref = refs[i];
      if (!ref.is_object()) throw invalid(r, name, path, "must be an object");
      for (const char* field : {"apiVersion", "kind", "name", "uid"}) {
        if (!ref.contains(field) || !ref[field].is_string() ||
            ref[field].get_ref<const std::string&>().empty())
          throw invalid(r, name, path + "." + field,
                        std::string("Invalid value: ") + (ref.contains(field) ? ref[field].dump() : "\"\"") +
                            ": " + field + " must be a non-empty string");
      }
      for (const char* field : {"controller", "blockOwnerDeletion"})
        if (ref.contains(field) && !ref[field].is_null() && !ref[field].is_boolean())
          throw invalid(r, name, path + "." + field, "Invalid value: must be a boolean");
      if (ref.value("controller", Object(false)) == Object(true)) ++controllers;
    }
    if (controllers > 1)
      throw invalid(r, name, "metadata.ownerReferences",
                    "Invalid value: only one reference can have Controller set to true");
  }
}

std::string random_suffix(int64_t seed) {
  static const char kChars[] = "bcdfghjklmnpqrstvwxz2456789";  // the API server's alphabet
  std::mt19937_64 rng(static_cast<uint64_t>(seed) * 0x9E3779B97F4A7C15ull);
  std::string s;
  for (int i = 0; i < 5; ++i) s += kChars[rng() % (sizeof(kChars) - 1)];
  return s;
}

// The object without metadata (and without status when it is a subresource): what generation
// tracks.
Object generation_view(const Object& obj, bool status_subresource) {
  Object v = obj;
  v.erase("metadata");
  if (status_subresource) v.erase("status");
  return v;
}

}  // namespace

// ---- the store -------------------------------------------------------------------------------

Store::Store(StoreOptions options) : options_(options), watches_(options.history_limit, options.history_limit_bytes) {
  for (const BuiltinResource& b : builtin_resources()) {
    register_locked(b.resource, b.status);
    Kind& kind = kinds_[kind_key(b.resource)];
    kind.builtin = true;
    if (const Object* schema = builtin_schema(b.resource)) kind.schema = *schema;
  }
}

Store::~Store() {
  std::lock_guard<std::mutex> lock(mutex_);
  watches_.end_all();
}

void Store::register_resource(const Resource& resource, bool status_subresource) {
  std::lock_guard<std::mutex> lock(mutex_);
  register_locked(resource, status_subresource);
}

void Store::register_locked(const Resource& resource, bool status_subresource) {
  Kind& kind = kinds_[kind_key(resource)];
  kind.resource = resource;
  kind.status_subresource = status_subresource;
}

void Store::set_fault(FaultHook hook) {
  std::lock_guard<std::mutex> lock(mutex_);
  fault_ = std::move(hook);
}

std::string Store::resource_version() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::to_string(version_);
}

void Store::fault(const std::string& verb, const Resource& r, const std::string& ns,
                  const std::string& name) {
  if (!fault_) return;
  if (auto error = fault_(verb, r, ns, name)) throw *error;
}

Store::Kind& Store::kind_of(const Resource& r) {
  const auto it = kinds_.find(kind_key(r));
  if (it == kinds_.end())
    throw ApiError(404, "NotFound",
                   "the server could not find the requested resource (" + r.plural +
                       (r.group.empty() ? "" : "." + r.group) + ")");
  return it->second;
}

void Store::record(const Kind& kind, WatchEventType type, const Object& obj,
                   const Object& old_obj, size_t obj_bytes) {
  const int64_t version = std::stoll(obj["metadata"]["resourceVersion"].get<std::string>());
  watches_.publish(version, kind_key(kind.resource), type, obj, old_obj,
                   (obj_bytes ? obj_bytes : approx_bytes(obj)) +
                       (old_obj.is_null() ? 0 : approx_bytes(old_obj)));
}

Object Store::get(const Resource& r, const std::string& ns, const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  fault("get", r, ns, name);
  Kind& kind = kind_of(r);
  const auto it = kind.objects.find(object_key(r.namespaced ? ns : "", name));
  if (it == kind.objects.end()) throw not_found(r, name);
  return it->second;
}

kube::ObjectList Store::list(const Resource& r, const std::string& ns,
                             const kube::ListOptions& opts) {
  std::lock_guard<std::mutex> lock(mutex_);
  fault("list", r, ns, "");
  Kind& kind = kind_of(r);
  kube::ObjectList out;
  out.resource_version = std::to_string(version_);
  // The continue token is the key of the last object returned: objects are kept sorted by
  // key, so the next page starts after it.
  std::string after;
  if (!opts.continue_token.empty()) {
    const auto bar = opts.continue_token.find('|');
    if (bar == std::string::npos || opts.continue_token.compare(0, bar, "kt1") != 0)
      throw ApiError(400, "BadRequest", "invalid continue token");
    after = opts.continue_token.substr(bar + 1);
  }
  const std::string prefix = r.namespaced && !ns.empty() ? ns + "/" : "";
  auto it = after.empty() ? kind.objects.lower_bound(prefix) : kind.objects.upper_bound(after);
  for (; it != kind.objects.end(); ++it) {
    if (!prefix.empty() && it->first.compare(0, prefix.size(), prefix) != 0) break;
    if (!matches_label_selector(it->second, opts.label_selector) ||
        !matches_field_selector(it->second, opts.field_selector))
      continue;
    if (opts.limit > 0 && static_cast<int64_t>(out.items.size()) == opts.limit) {
      out.continue_token = "kt1|" + std::prev(it)->first;
      // Only hand out a token when something matching remains.
      bool more = false;
      for (auto rest = it; rest != kind.objects.end(); ++rest) {
        if (!prefix.empty() && rest->first.compare(0, prefix.size(), prefix) != 0) break;
        if (matches_label_selector(rest->second, opts.label_selector) &&
            matches_field_selector(rest->second, opts.field_selector)) {
          more = true;
          break;
        }
      }
      if (!more) out.continue_token.clear();
      break;
    }
    out.items.push_back(it->second);
  }
  return out;
}

namespace {
thread_local bool dry_run_active = false;
}  // namespace

DryRun::DryRun(bool on) : previous_(dry_run_active) { dry_run_active = previous_ || on; }
DryRun::~DryRun() { dry_run_active = previous_; }
bool DryRun::active() { return dry_run_active; }

Object Store::create(const Resource& r, const std::string& ns, const Object& obj) {
  std::lock_guard<std::mutex> lock(mutex_);
  Kind& kind = kind_of(r);
  if (!obj.is_object()) throw ApiError(400, "BadRequest", "the body must be a JSON object");
  Object o = obj;
  if (!o.contains("metadata")) o["metadata"] = Object::object();
  Object& meta = o["metadata"];
  if (!meta.is_object()) throw invalid(r, "", "metadata", "must be an object");
  std::string name = meta.value("name", "");
  if (name.empty() && meta.contains("generateName") && meta["generateName"].is_string())
    name = meta["generateName"].get<std::string>() + random_suffix(++uid_counter_);
  fault("create", r, ns, name);
  if (name.empty())
    throw invalid(r, "", "metadata.name", "Required value: name or generateName is required");
  if (!valid_name(name))
    throw invalid(r, name, "metadata.name",
                  "Invalid value: \"" + name +
                      "\": a lowercase RFC 1123 subdomain must consist of lower case "
                      "alphanumeric characters, '-' or '.', and must start and end with an "
                      "alphanumeric character");
  if (o.contains("kind") && o["kind"] != r.kind)
    throw ApiError(400, "BadRequest", "the kind " + o["kind"].dump() + " does not match " + r.kind);
  if (r.namespaced) {
    if (ns.empty()) throw ApiError(400, "BadRequest", "a namespace is required for " + r.plural);
    if (meta.contains("namespace") && meta["namespace"] != ns && meta["namespace"] != "")
      throw ApiError(400, "BadRequest",
                     "the namespace of the provided object does not match the namespace sent on "
                     "the request");
    meta["namespace"] = ns;
  } else {
    meta.erase("namespace");
  }
  validate_metadata(r, name, meta);
  const std::string key = object_key(r.namespaced ? ns : "", name);
  if (kind.objects.count(key))
    throw ApiError(
        409, "AlreadyExists",
        r.plural + (r.group.empty() ? "" : "." + r.group) + " \"" + name + "\" already exists");
  meta["name"] = name;
  meta.erase("generateName");
  meta["uid"] = "00000000-0000-4000-8000-" + [&] {
    char buf[16];
    std::snprintf(buf, sizeof(buf), "%012llx", static_cast<unsigned long long>(++uid_counter_));
    return std::string(buf);
  }();
  meta["creationTimestamp"] = kube::now_rfc3339();
  meta["generation"] = 1;
  meta.erase("deletionTimestamp");
  if (kind.status_subresource) o.erase("status");  // set through the subresource only
  o["apiVersion"] = r.api_version();
  o["kind"] = r.kind;
  admit(kind, o, /*create=*/true);
  if (DryRun::active()) {
    check_size(r, name, o);
    return o;
  }
  meta["resourceVersion"] = next_version();
  const size_t bytes = check_size(r, name, o);
  kind.objects[key] = o;
  record(kind, WatchEventType::Added, o, nullptr, bytes);
  collect_if_orphaned(kind, key);
  return o;
}

// What the API server's registry strategies and admission do to a new or changed object of the
// built-in kinds that clients rely on: a namespace is Active, a Service gets a cluster IP, a
// Secret a type, a Deployment its defaults (replicas 1, RollingUpdate 25 %/25 %).
void Store::admit(Kind& kind, Object& o, bool create) {
  const Resource& r = kind.resource;
  if (r == kNamespaces && create) {
    o["status"] = {{"phase", "Active"}};
    if (!o.contains("spec")) o["spec"] = {{"finalizers", {"kubernetes"}}};
  } else if (r == kube::kServices) {
    Object& spec = o["spec"];
    if (!spec.is_object()) spec = Object::object();
    if (!spec.contains("type")) spec["type"] = "ClusterIP";
    if (!spec.contains("clusterIP") && spec["type"] != "ExternalName") {
      const int64_t n = ++uid_counter_;
      spec["clusterIP"] = "10.96." + std::to_string((n / 250) % 250) + "." +
                          std::to_string(n % 250 + 1);
    }
  } else if (r == kSecrets) {
    if (!o.contains("type")) o["type"] = "Opaque";
  } else if (r == kDeployments) {
    Object& spec = o["spec"];
    if (!spec.is_object()) spec = Object::object();
    if (!spec.contains("replicas")) spec["replicas"] = 1;
    if (!spec.contains("revisionHistoryLimit")) spec["revisionHistoryLimit"] = 10;
    if (!spec.contains("progressDeadlineSeconds")) spec["progressDeadlineSeconds"] = 600;
    if (!spec.contains("strategy"))
      spec["strategy"] = {{"type", "RollingUpdate"},
                          {"rollingUpdate", {{"maxSurge", "25%"}, {"maxUnavailable", "25%"}}}};
  } else if (r == kube::kCustomResourceDefinitions && !DryRun::active()) {
    register_crd(o);  // a changed CRD changes what its resource accepts
  }
  apply_schema(kind, o);
}

// Writes a new version of an existing object. `status_only`: keep everything but the status;
// otherwise keep the status when it is a subresource. `check_version`: a non-empty
// metadata.resourceVersion must be the stored one.
Object Store::write(Kind& kind, const std::string& ns, Object obj, bool status_only,
                    bool check_version) {
  const Resource& r = kind.resource;
  if (!obj.is_object() || !obj.contains("metadata") || !obj["metadata"].is_object())
    throw ApiError(400, "BadRequest", "the body must be an object with metadata");
  const std::string name = obj["metadata"].value("name", "");
  if (name.empty()) throw invalid(r, "", "metadata.name", "Required value");
  const auto it = kind.objects.find(object_key(r.namespaced ? ns : "", name));
  if (it == kind.objects.end()) throw not_found(r, name);
  const Object& old = it->second;
  const std::string version = obj["metadata"].value("resourceVersion", "");
  if (check_version && !version.empty() && version != old["metadata"]["resourceVersion"])
    throw ApiError(409, "Conflict",
                   "Operation cannot be fulfilled on " + r.plural +
                       (r.group.empty() ? "" : "." + r.group) + " \"" + name +
                       "\": the object has been modified; please apply your changes to the "
                       "latest version and try again");
  Object next;
  if (status_only) {
    next = old;
    if (obj.contains("status"))
      next["status"] = obj["status"];
    else
      next.erase("status");
    apply_schema(kind, next);
  } else {
    next = obj;
    if (kind.status_subresource) {
      if (old.contains("status"))
        next["status"] = old["status"];
      else
        next.erase("status");
    }
    Object& meta = next["metadata"];
    if (r.namespaced && meta.contains("namespace") && meta["namespace"] != ns &&
        meta["namespace"] != "")
      throw ApiError(400, "BadRequest", "the namespace of the object does not match the request");
    // The server owns these.
    for (const char* field : {"uid", "creationTimestamp", "namespace", "generation"}) {
      if (old["metadata"].contains(field))
        meta[field] = old["metadata"][field];
      else
        meta.erase(field);
    }
    meta["name"] = name;
    validate_metadata(r, name, meta);
    if (r == kube::kServices && old.contains("spec") && old["spec"].contains("clusterIP") &&
        next.contains("spec") && next["spec"].is_object() && !next["spec"].contains("clusterIP"))
      next["spec"]["clusterIP"] = old["spec"]["clusterIP"];  // immutable once allocated
    admit(kind, next, /*create=*/false);
  }
  // The server sets these before comparing: a body whose kind or apiVersion differs from the
  // stored one changes nothing, so it must not count as a new generation.
  next["apiVersion"] = r.api_version();
  next["kind"] = r.kind;
  if (!status_only && generation_view(next, kind.status_subresource) !=
                          generation_view(old, kind.status_subresource))
    next["metadata"]["generation"] = old["metadata"].value("generation", 1) + 1;
  if (next == old) return old;  // a no-op write keeps its version, as the API server does
  const size_t bytes = check_size(r, name, next);
  if (DryRun::active()) return next;
  next["metadata"]["resourceVersion"] = next_version();
  Object previous = old;
  it->second = next;
  record(kind, WatchEventType::Modified, next, previous, bytes);
  if (!status_only) collect_if_orphaned(kind, it->first);
  return next;
}

Object Store::update(const Resource& r, const std::string& ns, const Object& obj) {
  std::lock_guard<std::mutex> lock(mutex_);
  fault("update", r, ns, obj.is_object() ? obj.value("/metadata/name"_json_pointer, "") : "");
  return write(kind_of(r), ns, obj, false, true);
}

Object Store::update_status(const Resource& r, const std::string& ns, const Object& obj) {
  std::lock_guard<std::mutex> lock(mutex_);
  fault("update_status", r, ns,
        obj.is_object() ? obj.value("/metadata/name"_json_pointer, "") : "");
  Kind& kind = kind_of(r);
  if (!kind.status_subresource)
    throw ApiError(404, "NotFound", r.plural + " has no status subresource");
  return write(kind, ns, obj, true, true);
}

Object Store::merge_patch(const Resource& r, const std::string& ns, const std::string& name,
                          const Object& patch, bool status_subresource) {
  std::lock_guard<std::mutex> lock(mutex_);
  fault("patch", r, ns, name);
  Kind& kind = kind_of(r);
  if (status_subresource && !kind.status_subresource)
    throw ApiError(404, "NotFound", r.plural + " has no status subresource");
  const auto it = kind.objects.find(object_key(r.namespaced ? ns : "", name));
  if (it == kind.objects.end()) throw not_found(r, name);
  if (!patch.is_object()) throw ApiError(400, "BadRequest", "a merge patch must be an object");
  Object patched = it->second;
  // A resourceVersion in the patch is a precondition (check_version below); then it is replaced.
  patched.merge_patch(patch);
  patched["metadata"]["name"] = name;
  return write(kind, ns, patched, status_subresource, true);
}

void Store::remove(const Resource& r, const std::string& ns, const std::string& name,
                   kube::Propagation propagation) {
  std::lock_guard<std::mutex> lock(mutex_);
  fault("delete", r, ns, name);
  Kind& kind = kind_of(r);
  const std::string key = object_key(r.namespaced ? ns : "", name);
  if (!kind.objects.count(key)) throw not_found(r, name);
  if (DryRun::active()) return;
  remove_locked(kind, key, propagation);
}

void Store::remove_locked(Kind& kind, const std::string& key, kube::Propagation propagation) {
  const auto it = kind.objects.find(key);
  if (it == kind.objects.end()) return;  // already collected through another owner
  Object gone = it->second;
  kind.objects.erase(it);
  gone["metadata"]["resourceVersion"] = next_version();
  record(kind, WatchEventType::Deleted, gone, nullptr);
  const std::string uid = gone["metadata"].value("uid", "");
  if (kind.resource == kube::kCustomResourceDefinitions) {
    // The defined resource goes away with its objects, each deleted (its watchers told, its
    // dependents collected) as the API server's CRD finalizer does.
    const std::string group = gone["spec"].value("group", "");
    const std::string plural = gone["spec"]["names"].value("plural", "");
    if (const auto defined = kinds_.find(group + "/" + plural); defined != kinds_.end()) {
      std::vector<std::string> keys;
      for (const auto& [object_key, _] : defined->second.objects) keys.push_back(object_key);
      for (const std::string& object_key : keys)
        remove_locked(defined->second, object_key, kube::Propagation::Background);
      kinds_.erase(group + "/" + plural);
    }
  }
  // The garbage collector: find the dependents (objects whose ownerReferences name this uid).
  std::vector<std::pair<Kind*, std::string>> dependents;
  for (auto& [_, other] : kinds_)
    for (const auto& [other_key, obj] : other.objects) {
      const Object& refs = obj["metadata"].value("ownerReferences", Object::array());
      if (!refs.is_array()) continue;
      for (const auto& ref : refs)
        if (ref.is_object() && ref.value("uid", Object("")) == Object(uid))
          dependents.emplace_back(&other, other_key);
    }
  for (auto& [dep_kind, dep_key] : dependents) {
    if (propagation == kube::Propagation::Orphan) {
      Object obj = dep_kind->objects.at(dep_key);
      Object refs = Object::array();
      for (const auto& ref : obj["metadata"]["ownerReferences"])
        if (ref.value("uid", "") != uid) refs.push_back(ref);
      if (refs.empty())
        obj["metadata"].erase("ownerReferences");
      else
        obj["metadata"]["ownerReferences"] = refs;
      const Object previous = dep_kind->objects.at(dep_key);
      obj["metadata"]["resourceVersion"] = next_version();
      dep_kind->objects[dep_key] = obj;
      record(*dep_kind, WatchEventType::Modified, obj, previous);
    } else {
      remove_locked(*dep_kind, dep_key, kube::Propagation::Background);
    }
  }
}

// The kube-controller-manager's garbage collector for one object: when it has owner references
// and none of them names an object that exists with that uid (the owner was deleted before the
// dependent was written, as by a client acting on a stale cache), the dependent is deleted. The
// real collector does this within moments; here it happens with the write, so a test sees the
// outcome at once. An owner of a kind this store does not serve counts as existing (the
// collector cannot resolve it either, and leaves the dependent alone).
void Store::collect_if_orphaned(Kind& kind, const std::string& key) {
  const auto it = kind.objects.find(key);
  if (it == kind.objects.end()) return;
  const Object& meta = it->second["metadata"];
  if (!meta.contains("ownerReferences") || !meta["ownerReferences"].is_array() ||
      meta["ownerReferences"].empty())
    return;
  const std::string ns = meta.value("namespace", "");
  for (const Object& ref : meta["ownerReferences"]) {
    const std::string api_version = ref.value("apiVersion", "");
    const auto slash = api_version.find('/');
    const std::string group = slash == std::string::npos ? "" : api_version.substr(0, slash);
    const std::string owner_kind = ref.value("kind", "");
    const Kind* owners = nullptr;
    for (const auto& [_, candidate] : kinds_)
      if (candidate.resource.kind == owner_kind && candidate.resource.group == group)
        owners = &candidate;
    if (!owners) return;  // unresolvable: not collected
    const auto owner = owners->objects.find(
        object_key(owners->resource.namespaced ? ns : "", ref.value("name", "")));
    if (owner != owners->objects.end() &&
        owner->second["metadata"].value("uid", "") == ref.value("uid", ""))
      return;  // one owner exists
  }
  remove_locked(kind, key, kube::Propagation::Background);
}

// The API server's bound on an object (etcd's request limit, 1.5 MiB): a larger object is
// refused, so that no client can grow the store (and its watch history) without bound. Returns
// the object's size, which the watch history counts.
size_t Store::check_size(const Resource& r, const std::string& name, const Object& object) {
  constexpr size_t kMaxObjectBytes = 3 * 512 * 1024;
  const size_t bytes = approx_bytes(object);
  if (bytes > kMaxObjectBytes)
    throw ApiError(413, "RequestEntityTooLarge",
                   r.kind + " \"" + name + "\" is too large: " + std::to_string(bytes) +
                       " bytes; the limit is " + std::to_string(kMaxObjectBytes) + " bytes");
  return bytes;
}

void Store::register_crd(const Object& crd) {
  const Object spec = crd.value("spec", Object::object());
  const Object names = spec.value("names", Object::object());
  const std::string name = crd["metadata"].value("name", "");
  const Resource& r = kube::kCustomResourceDefinitions;
  Resource defined;
  defined.group = spec.value("group", "");
  defined.plural = names.value("plural", "");
  defined.kind = names.value("kind", "");
  if (defined.group.empty()) throw invalid(r, name, "spec.group", "Required value");
  if (defined.plural.empty()) throw invalid(r, name, "spec.names.plural", "Required value");
  if (defined.kind.empty()) throw invalid(r, name, "spec.names.kind", "Required value");
  if (name != defined.plural + "." + defined.group)
    throw invalid(r, name, "metadata.name",
                  "Invalid value: must be spec.names.plural+\".\"+spec.group");
  const std::string scope = spec.value("scope", "Namespaced");
  if (scope != "Namespaced" && scope != "Cluster")
    throw invalid(r, name, "spec.scope", "Unsupported value: \"" + scope + "\"");
  defined.namespaced = scope == "Namespaced";
  bool status = false;
  for (const auto& v : spec.value("versions", Object::array())) {
    // The storage version is the one served here.
    if (defined.version.empty() || v.value("storage", false)) {
      defined.version = v.value("name", "");
      status = v.contains("subresources") && v["subresources"].contains("status");
    }
  }
  if (defined.version.empty()) throw invalid(r, name, "spec.versions", "Required value");
  register_locked(defined, status);
  const Object* schema = find_version_schema(crd, defined.version);
  kinds_[kind_key(defined)].schema = schema ? *schema : Object();
}

// The API server's handling of a custom resource's structural schema: defaults filled in,
// unknown fields pruned (a client asking for fieldValidation=Strict was refused by the HTTP
// front end before), and every violation reported with its field path (422 Invalid).
void Store::apply_schema(const Kind& kind, Object& o) {
  if (kind.schema.is_null()) return;
  const SchemaResult result = apply_structural_schema(kind.schema, o, /*prune=*/true);
  if (result.errors.empty()) return;
  const Resource& r = kind.resource;
  const std::string name = o["metadata"].value("name", "");
  // A built-in kind is decoded into Go structs before it is validated: a value of the wrong type
  // fails the decoding, a 400 ("cannot be handled as a Pod"), not a 422.
  if (kind.builtin) {
    std::string type_errors;
    for (const FieldError& e : result.causes)
      if (e.type == "FieldValueTypeInvalid") type_errors += (type_errors.empty() ? "" : ", ") + e.to_string();
    if (!type_errors.empty())
      throw ApiError(400, "BadRequest",
                     r.kind + " in version \"" + r.version + "\" cannot be handled as a " + r.kind +
                         ": " + type_errors);
  }
  Object causes = Object::array();
  for (const FieldError& e : result.causes)
    causes.push_back({{"reason", e.type}, {"message", e.body}, {"field", e.field}});
  ApiError error(422, "Invalid",
                 format_invalid(r.kind + (r.group.empty() ? "" : "." + r.group), name,
                                result.errors));
  throw error.with_details({{"name", name}, {"group", r.group}, {"kind", r.kind}, {"causes", causes}});
}

std::unique_ptr<kube::Watch> Store::watch(const Resource& r, const std::string& ns,
                                          const kube::WatchOptions& opts) {
  std::lock_guard<std::mutex> lock(mutex_);
  fault("watch", r, ns, "");
  Kind& kind = kind_of(r);
  WatchSubscription subscription;
  subscription.kind_key = kind_key(r);
  subscription.resource = kind.resource;
  subscription.ns = r.namespaced ? ns : "";
  subscription.label_selector = opts.label_selector;
  subscription.field_selector = opts.field_selector;
  matches_label_selector(Object::object(), opts.label_selector);  // throws 400 when malformed
  matches_field_selector(Object::object(), opts.field_selector);
  subscription.allow_bookmarks = opts.allow_bookmarks;
  subscription.bookmark_interval = options_.bookmark_interval;
  const int timeout =
      opts.timeout_seconds > 0 ? opts.timeout_seconds : options_.default_watch_timeout_seconds;
  subscription.deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout);
  if (opts.resource_version.empty() || opts.resource_version == "0")
    return watches_.watch_from_list(subscription, version_, kind.objects);
  return watches_.watch_from_version(subscription, version_, opts.resource_version);
}

}  // namespace kt::local
