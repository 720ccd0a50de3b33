#include "operator/kube/informer.h"

#include <cstdio>
#include <random>

#include "api/error.h"
#include "operator/kube/objects.h"

namespace kt::kube {
namespace {

// Thrown inside the informer's thread to go back to listing.
struct Relist {
  std::string why;
};

std::string resource_version_of(const Object& object) {
  if (object.contains("metadata") && object["metadata"].is_object()) {
    return object["metadata"].value("resourceVersion", "");
  }
  return "";
}

}  // namespace

std::string object_key(const Object& object) {
  const Object& meta = object.at("metadata");
  const std::string name = meta.value("name", "");
  const std::string ns = meta.value("namespace", "");
  return ns.empty() ? name : ns + "/" + name;
}

Informer::Informer(Client& client, Resource resource, std::string ns, std::string label_selector)
    : Informer(client, std::move(resource), std::move(ns), std::move(label_selector),
               InformerTiming{}) {}

Informer::Informer(Client& client, Resource resource, std::string ns, std::string label_selector,
                   InformerTiming timing)
    : client_(client), resource_(std::move(resource)), namespace_(std::move(ns)),
      label_selector_(std::move(label_selector)), timing_(timing) {}

Informer::~Informer() {
  stop();
}

void Informer::add_handler(std::function<void(WatchEventType, const Object&)> handler) {
  KT_CHECK(!thread_.joinable(), "Informer::add_handler after start()");
  handlers_.push_back(std::move(handler));
}

void Informer::set_transform(Transform transform) {
  KT_CHECK(!thread_.joinable(), "Informer::set_transform after start()");
  transform_ = std::move(transform);
}

void Informer::start() {
  KT_CHECK(!thread_.joinable(), "Informer::start called twice");
  thread_ = std::thread([this] { run(); });
}

void Informer::stop() {
  {
    std::lock_guard lock(stop_mutex_);
    stopping_ = true;
    if (current_watch_) current_watch_->stop();
    stop_cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

bool Informer::has_synced() const {
  return synced_.load();
}

void Informer::add_index(const std::string& name, IndexFunc values) {
  KT_CHECK(!thread_.joinable(), "Informer::add_index after start()");
  indexes_[name] = Index{std::move(values), {}};
}

bool Informer::wait_for_sync(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(cache_mutex_);
  return synced_cv_.wait_for(lock, timeout, [&] { return synced_.load(); });
}

std::string Informer::last_resource_version() const {
  std::lock_guard lock(cache_mutex_);
  return version_;
}

std::vector<Object> Informer::list() const {
  return list("", nullptr);
}

std::vector<Object> Informer::list(const std::string& ns, const Predicate& keep) const {
  std::lock_guard lock(cache_mutex_);
  std::vector<Object> out;
  // Keys are "ns/name": one namespace is one range of the map.
  const std::string prefix = ns.empty() ? "" : ns + "/";
  for (auto it = cache_.lower_bound(prefix);
       it != cache_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
    if (!keep || keep(it->second)) out.push_back(it->second);
  }
  return out;
}

std::optional<Object> Informer::get(const std::string& ns, const std::string& name) const {
  std::lock_guard lock(cache_mutex_);
  auto it = cache_.find(ns.empty() ? name : ns + "/" + name);
  if (it == cache_.end()) return std::nullopt;
  return it->second;
}

std::vector<Object> Informer::by_index(const std::string& index, const std::string& value,
                                       const std::string& ns, const Predicate& keep) const {
  const auto found = indexes_.find(index);
  KT_CHECK(found != indexes_.end(), "Informer::by_index: no index " + index);
  std::lock_guard lock(cache_mutex_);
  std::vector<Object> out;
  const auto keys = found->second.keys.find(value);
  if (keys == found->second.keys.end()) return out;
  const std::string prefix = ns.empty() ? "" : ns + "/";
  for (const std::string& key : keys->second) {
    if (key.compare(0, prefix.size(), prefix) != 0) continue;
    const auto it = cache_.find(key);
    if (it != cache_.end() && (!keep || keep(it->second))) out.push_back(it->second);
  }
  return out;
}

void Informer::index_locked(const std::string& key, const Object* old_object,
                            const Object* new_object) {
  for (auto& [name, index] : indexes_) {
    if (old_object) {
      for (const std::string& value : index.values(*old_object)) {
        auto it = index.keys.find(value);
        if (it == index.keys.end()) continue;
        it->second.erase(key);
        if (it->second.empty()) index.keys.erase(it);
      }
    }
    if (new_object)
      for (const std::string& value : index.values(*new_object)) index.keys[value].insert(key);
  }
}

void Informer::reindex_locked() {
  for (auto& [name, index] : indexes_) index.keys.clear();
  for (const auto& [key, object] : cache_) index_locked(key, nullptr, &object);
}

void Informer::set_version(const std::string& version) {
  if (version.empty()) return;
  std::lock_guard lock(cache_mutex_);
  version_ = version;
}

bool Informer::sleep_unless_stopped(std::chrono::milliseconds duration) {
  std::unique_lock lock(stop_mutex_);
  return !stop_cv_.wait_for(lock, duration, [&] { return stopping_; });
}

void Informer::emit(WatchEventType type, const Object& object) {
  for (const auto& handler : handlers_) handler(type, object);
}

void Informer::apply(WatchEventType type, const Object& object) {
  const std::string key = object_key(object);
  {
    std::lock_guard lock(cache_mutex_);
    const auto it = cache_.find(key);
    const Object* old_object = it == cache_.end() ? nullptr : &it->second;
    if (type == WatchEventType::Deleted) {
      index_locked(key, old_object, nullptr);
      if (old_object) cache_.erase(it);
    } else {
      index_locked(key, old_object, &object);
      cache_[key] = object;
    }
    if (const std::string version = resource_version_of(object); !version.empty())
      version_ = version;
  }
  emit(type, object);
}

std::string Informer::list_and_sync() {
  ListOptions options;
  options.label_selector = label_selector_;
  options.limit = timing_.page_size;
  std::map<std::string, Object> fresh;
  std::string version;
  do {
    ObjectList page = client_.list(resource_, namespace_, options);
    for (Object& item : page.items) {
      if (transform_) transform_(item);
      // The key first: json's operator= takes its argument by value, and C++17 evaluates the
      // right side of an assignment first, so the item would be moved from already.
      std::string key = object_key(item);
      fresh[key] = std::move(item);
    }
    version = page.resource_version;
    options.continue_token = page.continue_token;
  } while (!options.continue_token.empty());
  lists_++;

  // Replace the cache and tell the handlers what changed, deletions included. The events point
  // into the new cache and the old one (kept until they are told), not copies: a first list of
  // 10,000 nodes would otherwise be held twice at once. Only this thread changes the cache, so
  // what they point to stays while the handlers run (outside the lock).
  std::map<std::string, Object> previous;
  std::vector<std::pair<WatchEventType, const Object*>> events;
  {
    std::lock_guard lock(cache_mutex_);
    previous = std::move(cache_);
    cache_ = std::move(fresh);
    for (const auto& [key, old] : previous) {
      if (!cache_.count(key)) events.emplace_back(WatchEventType::Deleted, &old);
    }
    for (const auto& [key, object] : cache_) {
      auto it = previous.find(key);
      if (it == previous.end()) {
        events.emplace_back(WatchEventType::Added, &object);
      } else if (resource_version_of(it->second) != resource_version_of(object)) {
        events.emplace_back(WatchEventType::Modified, &object);
      }
    }
    reindex_locked();
    if (!version.empty()) version_ = version;
  }
  for (const auto& [type, object] : events) emit(type, *object);
  previous.clear();
  // Synced once the handlers have seen the first list too: what they keep (the inventory
  // tracker's counts) is then as complete as the cache.
  {
    std::lock_guard lock(cache_mutex_);
    synced_ = true;
  }
  synced_cv_.notify_all();
  return version;
}

void Informer::watch_from(std::string& version) {
  static thread_local std::mt19937 random(std::random_device{}());
  WatchOptions options;
  options.resource_version = version;
  options.label_selector = label_selector_;
  options.allow_bookmarks = true;
  options.timeout_seconds = std::uniform_int_distribution<int>(
      timing_.min_watch_timeout_seconds, timing_.max_watch_timeout_seconds)(random);
  std::unique_ptr<Watch> watch;
  try {
    watch = client_.watch(resource_, namespace_, options);
  } catch (const ApiError& e) {
    if (e.gone()) throw Relist{e.what()};
    throw;
  }
  watches_++;
  {
    std::lock_guard lock(stop_mutex_);
    if (stopping_) return;
    current_watch_ = watch.get();
  }
  struct Detach {
    Informer* self;
    ~Detach() {
      std::lock_guard lock(self->stop_mutex_);
      self->current_watch_ = nullptr;
    }
  } detach{this};

  for (;;) {
    auto event = watch->next(std::chrono::milliseconds(500));
    if (!event) {
      if (watch->ended()) return;
      std::lock_guard lock(stop_mutex_);
      if (stopping_) return;
      continue;
    }
    switch (event->type) {
      case WatchEventType::Error:
        throw Relist{"watch error event: " + event->object.dump()};
      case WatchEventType::Bookmark:
        version = resource_version_of(event->object);
        set_version(version);
        break;
      default:
        version = resource_version_of(event->object);
        if (transform_) transform_(event->object);
        apply(event->type, event->object);
    }
  }
}

void Informer::run() {
  std::chrono::milliseconds backoff = timing_.initial_backoff;
  auto back_off = [&] {
    // ±25% jitter so that many informers do not retry in step.
    static thread_local std::mt19937 random(std::random_device{}());
    const double jitter = std::uniform_real_distribution<double>(0.75, 1.25)(random);
    const auto wait = std::chrono::milliseconds(static_cast<std::int64_t>(backoff.count() * jitter));
    backoff = std::min(backoff * 2, timing_.max_backoff);
    return sleep_unless_stopped(wait);
  };

  std::string version;
  bool need_list = true;
  auto listed_at = std::chrono::steady_clock::time_point{};
  for (;;) {
    {
      std::lock_guard lock(stop_mutex_);
      if (stopping_) return;
    }
    try {
      if (need_list) {
        version = list_and_sync();
        listed_at = std::chrono::steady_clock::now();
        need_list = false;
      }
      const auto started = std::chrono::steady_clock::now();
      watch_from(version);
      // A watch that ended on its own: watch again. One that ended at once is treated as an
      // error so that a server dropping every watch is not hammered.
      if (std::chrono::steady_clock::now() - started < std::chrono::seconds(1)) {
        if (!back_off()) return;
      } else {
        backoff = timing_.initial_backoff;
      }
    } catch (const Relist&) {
      // At once: 410 is the normal way to learn that the history was compacted. Only a server
      // that keeps answering so right after a list is backed off.
      need_list = true;
      if (std::chrono::steady_clock::now() - listed_at < std::chrono::seconds(1) && !back_off()) {
        return;
      }
    } catch (const std::exception& e) {
      // Transport failure, a 5xx/429 or a 403 on list or watch: say so (a silent informer is
      // an operator that never becomes ready), back off, then relist if the list itself
      // failed, else resume the watch from the last version.
      std::fprintf(stderr,
                   "ts=%s level=error msg=\"%s %s failed; retrying\" resource=%s err=\"%s\"\n",
                   now_rfc3339().c_str(), need_list ? "list" : "watch",
                   resource_.plural.c_str(),
                   (resource_.plural + (resource_.group.empty() ? "" : "." + resource_.group)).c_str(),
                   e.what());
      if (!back_off()) return;
    }
  }
}

}  // namespace kt::kube
