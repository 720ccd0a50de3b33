#include "operator/kube/cache.h"

#include "operator/kube/objects.h"
#include "operator/kube/selectors.h"

namespace kt::kube {
namespace {

thread_local std::int64_t t_api_requests = 0;

std::string collection(const Resource& r) {
  return r.plural + (r.group.empty() ? "" : "." + r.group);
}

// A write whose version is not a number (-1) is not remembered.
std::int64_t version_of(const Object& object) {
  return resource_version_number(object);
}

std::string key_of(const Resource& r, const std::string& ns, const std::string& name) {
  return r.namespaced && !ns.empty() ? ns + "/" + name : name;
}

// The resourceVersion of the informer's copy of the object with key `key` ("ns/name"), -1 if none.
std::int64_t cached_version_of(const Informer& informer, const std::string& key) {
  const auto slash = key.find('/');
  const auto cached = slash == std::string::npos
                          ? informer.get("", key)
                          : informer.get(key.substr(0, slash), key.substr(slash + 1));
  return cached ? version_of(*cached) : -1;
}

bool in_namespace(const std::string& key, const std::string& ns) {
  return ns.empty() || key.compare(0, ns.size() + 1, ns + "/") == 0;
}

}  // namespace

// ---- Cache --------------------------------------------------------------------------------------

Cache::Cache(Client& client, CacheOptions options) : options_(std::move(options)) {
  for (const CachedResource& cached : options_.resources) {
    KT_CHECK(!informer(cached.resource), "Cache: " + collection(cached.resource) + " twice");
    auto informer = std::make_unique<Informer>(client, cached.resource, cached.ns,
                                               cached.label_selector, options_.timing);
    if (cached.transform) informer->set_transform(cached.transform);
    for (const std::string& key : cached.indexed_labels) {
      informer->add_index(label_index(key), [key](const Object& object) {
        const Object* labels = nullptr;
        if (object.contains("metadata") && object["metadata"].contains("labels"))
          labels = &object["metadata"]["labels"];
        if (!labels || !labels->is_object()) return std::vector<std::string>{};
        const auto it = labels->find(key);
        if (it == labels->end() || !it->is_string()) return std::vector<std::string>{};
        return std::vector<std::string>{it->get<std::string>()};
      });
    }
    for (const std::string& field : cached.indexed_fields) {
      parse_field_selector(field + "=");  // an unsupported field fails here, not at each list
      informer->add_index(field_index(field), [field](const Object& object) {
        return std::vector<std::string>{field_value(object, field)};
      });
    }
    informers_.push_back(std::move(informer));
  }
}

Cache::~Cache() {
  stop();
}

Informer* Cache::informer(const Resource& resource) {
  for (auto& informer : informers_)
    if (informer->resource() == resource) return informer.get();
  return nullptr;
}

const Informer* Cache::informer(const Resource& resource) const {
  for (const auto& informer : informers_)
    if (informer->resource() == resource) return informer.get();
  return nullptr;
}

void Cache::start() {
  std::lock_guard lock(start_mutex_);
  if (started_) return;
  started_ = true;
  for (auto& informer : informers_) informer->start();
}

void Cache::stop() {
  std::lock_guard lock(start_mutex_);
  for (auto& informer : informers_) informer->stop();
}

bool Cache::has_synced() const {
  for (const auto& informer : informers_)
    if (!informer->has_synced()) return false;
  return true;
}

// ---- CachingClient ------------------------------------------------------------------------------

CachingClient::CachingClient(Client& api, Cache& cache) : api_(api), cache_(cache) {}

std::int64_t CachingClient::api_requests_on_this_thread() {
  return t_api_requests;
}

const Informer* CachingClient::reader(const Resource& r, const std::string& ns) {
  const Informer* informer = cache_.informer(r);
  if (!informer) return nullptr;
  if (r.namespaced && !informer->ns().empty() && informer->ns() != ns) return nullptr;
  if (!informer->has_synced() && !informer->wait_for_sync(cache_.options().sync_timeout))
    return nullptr;
  return informer;
}

std::optional<Object> CachingClient::newer_write(const Informer& informer, const Resource& r,
                                                 const std::string& key,
                                                 std::int64_t cached_version) {
  std::lock_guard lock(written_mutex_);
  const auto of_resource = written_.find(collection(r));
  if (of_resource == written_.end()) return std::nullopt;
  const auto it = of_resource->second.find(key);
  if (it == of_resource->second.end()) return std::nullopt;
  const Written& written = it->second;
  const bool seen = cached_version >= written.version ||
                    version_number(informer.last_resource_version()) >= written.version;
  if (seen || std::chrono::steady_clock::now() - written.at > cache_.options().mutation_ttl) {
    of_resource->second.erase(it);
    return std::nullopt;
  }
  return written.object;
}

void CachingClient::remember(const Resource& r, const Object& written) {
  if (!cache_.informer(r)) return;
  const std::int64_t version = version_of(written);
  if (version < 0 || !written.contains("metadata") || !written["metadata"].contains("name"))
    return;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(written_mutex_);
  auto& of_resource = written_[collection(r)];
  // Writes nobody reads again (an object deleted by the garbage collector) expire here.
  if (of_resource.size() >= 256 && of_resource.size() % 256 == 0) {
    for (auto it = of_resource.begin(); it != of_resource.end();)
      it = now - it->second.at > cache_.options().mutation_ttl ? of_resource.erase(it) : ++it;
  }
  of_resource[object_key(written)] = Written{written, version, now};
}

void CachingClient::forget(const Resource& r, const std::string& ns, const std::string& name) {
  std::lock_guard lock(written_mutex_);
  const auto of_resource = written_.find(collection(r));
  if (of_resource != written_.end()) of_resource->second.erase(key_of(r, ns, name));
}

Object CachingClient::get(const Resource& r, const std::string& ns, const std::string& name) {
  const Informer* informer = reader(r, ns);
  if (!informer) {
    ++t_api_requests;
    return api_.get(r, ns, name);
  }
  const std::string object_ns = r.namespaced ? ns : "";
  std::optional<Object> cached = informer->get(object_ns, name);
  if (auto mine = newer_write(*informer, r, key_of(r, object_ns, name),
                              cached ? version_of(*cached) : -1))
    return *mine;
  if (cached) return *cached;
  if (!informer->label_selector().empty()) {
    // The informer sees only labelled objects: one without the label may exist.
    ++t_api_requests;
    return api_.get(r, ns, name);
  }
  throw ApiError(404, "NotFound", collection(r) + " \"" + name + "\" not found");
}

ObjectList CachingClient::list(const Resource& r, const std::string& ns, const ListOptions& opts) {
  const Informer* informer = opts.limit > 0 || !opts.continue_token.empty() ? nullptr
                                                                            : reader(r, ns);
  // Parsed first: a malformed selector is a 400 whoever answers.
  const auto labels = parse_label_selector(opts.label_selector);
  const auto fields = parse_field_selector(opts.field_selector);
  if (informer &&
      !label_selector_implies(labels, parse_label_selector(informer->label_selector())))
    informer = nullptr;
  if (!informer) {
    ++t_api_requests;
    return api_.list(r, ns, opts);
  }

  const std::string object_ns = r.namespaced ? ns : "";
  const auto keep = [&](const Object& object) {
    return matches(object, labels) && matches(object, fields);
  };
  ObjectList out;
  out.resource_version = informer->last_resource_version();
  // The narrowest read: one name (one key only within a namespace: across all of them the name
  // may be in several), else an index, else the namespace.
  const auto name = required_field_value(fields, "metadata.name");
  if (name && (!r.namespaced || !object_ns.empty())) {
    if (auto object = informer->get(object_ns, *name); object && keep(*object))
      out.items.push_back(std::move(*object));
  } else {
    bool indexed = false;
    for (const LabelRequirement& requirement : labels) {
      const auto value = required_label_value(labels, requirement.key);
      if (!value || !informer->has_index(Cache::label_index(requirement.key))) continue;
      out.items = informer->by_index(Cache::label_index(requirement.key), *value, object_ns, keep);
      indexed = true;
      break;
    }
    for (const FieldRequirement& requirement : fields) {
      if (indexed) break;
      if (requirement.negate || !informer->has_index(Cache::field_index(requirement.field)))
        continue;
      out.items = informer->by_index(Cache::field_index(requirement.field), requirement.value,
                                     object_ns, keep);
      indexed = true;
    }
    if (!indexed) out.items = informer->list(object_ns, keep);
  }

  // Our own writes the informer has not seen yet replace (or join) its copies.
  std::vector<std::string> keys;
  {
    std::lock_guard lock(written_mutex_);
    const auto of_resource = written_.find(collection(r));
    if (of_resource != written_.end())
      for (const auto& [key, written] : of_resource->second)
        if (in_namespace(key, object_ns)) keys.push_back(key);
  }
  if (keys.empty()) return out;
  std::map<std::string, std::size_t> position;  // of each listed object, by key
  for (std::size_t i = 0; i < out.items.size(); ++i) position[object_key(out.items[i])] = i;
  std::vector<bool> dropped(out.items.size(), false);
  for (const std::string& key : keys) {
    const auto listed = position.find(key);
    const std::int64_t cached_version = listed != position.end()
                                            ? version_of(out.items[listed->second])
                                            : cached_version_of(*informer, key);
    auto mine = newer_write(*informer, r, key, cached_version);
    if (!mine) continue;
    const bool wanted = keep(*mine);
    if (listed == position.end()) {
      if (wanted) out.items.push_back(std::move(*mine));
    } else if (wanted) {
      out.items[listed->second] = std::move(*mine);
    } else {
      dropped[listed->second] = true;  // our write moved it out of the selection
    }
  }
  std::size_t kept = 0;
  for (std::size_t i = 0; i < out.items.size(); ++i)
    if (i >= dropped.size() || !dropped[i]) {
      if (kept != i) out.items[kept] = std::move(out.items[i]);
      ++kept;
    }
  out.items.resize(kept);
  return out;
}

Object CachingClient::create(const Resource& r, const std::string& ns, const Object& obj) {
  ++t_api_requests;
  Object created = api_.create(r, ns, obj);
  remember(r, created);
  return created;
}

Object CachingClient::update(const Resource& r, const std::string& ns, const Object& obj) {
  ++t_api_requests;
  Object updated = api_.update(r, ns, obj);
  remember(r, updated);
  return updated;
}

Object CachingClient::update_status(const Resource& r, const std::string& ns, const Object& obj) {
  ++t_api_requests;
  Object updated = api_.update_status(r, ns, obj);
  remember(r, updated);
  return updated;
}

Object CachingClient::merge_patch(const Resource& r, const std::string& ns,
                                  const std::string& name, const Object& patch,
                                  bool status_subresource) {
  ++t_api_requests;
  Object patched = api_.merge_patch(r, ns, name, patch, status_subresource);
  remember(r, patched);
  return patched;
}

void CachingClient::remove(const Resource& r, const std::string& ns, const std::string& name,
                           Propagation propagation) {
  ++t_api_requests;
  forget(r, ns, name);
  api_.remove(r, ns, name, propagation);
}

std::unique_ptr<Watch> CachingClient::watch(const Resource& r, const std::string& ns,
                                            const WatchOptions& opts) {
  ++t_api_requests;
  return api_.watch(r, ns, opts);
}

}  // namespace kt::kube
