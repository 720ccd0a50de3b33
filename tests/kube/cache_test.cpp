// The informer cache and its delegating client (cache.h) over the in-process Store: reads are
// answered as the Store answers them but without an API request, our own writes are read back at
// once, a stale read never makes a second object, deletions missed while the watch was down are
// caught by the relist, and a steady-state reconcile sends the API no read at all.
#include "operator/kube/cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <set>

#include "operator/controller/controller.h"
#include "operator/controller/manager.h"
#include "operator/controller/metrics.h"
#include "local/store.h"
#include "telemetry/metrics.h"
#include "tests/support/eventually.h"
#include "tests/support/forwarding_client.h"

namespace kt::kube {
namespace {

using namespace std::chrono_literals;
using test::eventually;

constexpr const char* kJobLabel = "kubetrain.dev/job-name";

// Short backoffs: a relist after a 410 takes milliseconds, not the production 0.8 s.
InformerTiming fast_timing() {
  InformerTiming timing;
  timing.initial_backoff = 10ms;
  timing.max_backoff = 100ms;
  return timing;
}

CacheOptions fast_cache(std::vector<CachedResource> resources) {
  CacheOptions options;
  options.resources = std::move(resources);
  options.timing = fast_timing();
  return options;
}

bool wait_for(const std::function<bool()>& condition) {
  return eventually(condition, 10s, 5ms);
}

// Counts the requests that reach the API through it: wrapped around the Store as the
// CachingClient's `api`, it sees exactly the reads the cache passed through (the informers list
// and watch the Store directly).
class CountingClient : public Client {
 public:
  explicit CountingClient(Client& api) : api_(api) {}

  Object get(const Resource& r, const std::string& ns, const std::string& name) override {
    ++gets;
    return api_.get(r, ns, name);
  }
  ObjectList list(const Resource& r, const std::string& ns, const ListOptions& opts) override {
    ++lists;
    return api_.list(r, ns, opts);
  }
  Object create(const Resource& r, const std::string& ns, const Object& obj) override {
    ++creates;
    return api_.create(r, ns, obj);
  }
  Object update(const Resource& r, const std::string& ns, const Object& obj) override {
    ++updates;
    return api_.update(r, ns, obj);
  }
  Object update_status(const Resource& r, const std::string& ns, const Object& obj) override {
    ++status_updates;
    return api_.update_status(r, ns, obj);
  }
  Object merge_patch(const Resource& r, const std::string& ns, const std::string& name,
                     const Object& patch, bool status_subresource) override {
    ++patches;
    return api_.merge_patch(r, ns, name, patch, status_subresource);
  }
  void remove(const Resource& r, const std::string& ns, const std::string& name,
              Propagation propagation) override {
    ++removes;
    api_.remove(r, ns, name, propagation);
  }
  std::unique_ptr<Watch> watch(const Resource& r, const std::string& ns,
                               const WatchOptions& opts) override {
    ++watches;
    return api_.watch(r, ns, opts);
  }

  int reads() const { return gets + lists; }
  int writes() const { return creates + updates + status_updates + patches + removes; }
  void reset() {
    for (auto* counter :
         {&gets, &lists, &creates, &updates, &status_updates, &patches, &removes, &watches})
      *counter = 0;
  }

  std::atomic<int> gets{0}, lists{0}, creates{0}, updates{0}, status_updates{0}, patches{0},
      removes{0}, watches{0};

 private:
  Client& api_;
};

// A Client whose watches of one resource can be held back, for the informers of a Cache: while
// held, every event that happens waits inside the watch (the informer lags the API, as behind a
// slow watch); break_watches() ends the open watches and drops what they held (a connection lost).
// Lists are never held: a relist sees the Store as it is.
class LaggingClient : public test::ForwardingClient {
 public:
  LaggingClient(Client& api, Resource lagging)
      : ForwardingClient(api), lagging_(std::move(lagging)) {}

  // Events that happen after hold() returns are held until release().
  void hold() { set_held(true); }
  void release() { set_held(false); }
  void break_watches() {
    {
      std::lock_guard lock(gate_->mutex);
      ++gate_->breaks;
    }
    gate_->changed.notify_all();
  }

  std::unique_ptr<Watch> watch(const Resource& r, const std::string& ns,
                               const WatchOptions& opts) override {
    std::unique_ptr<Watch> inner = inner_.watch(r, ns, opts);
    if (!(r == lagging_)) return inner;
    return std::make_unique<HeldWatch>(std::move(inner), gate_);
  }

 private:
  struct Gate {
    std::mutex mutex;
    std::condition_variable changed;
    bool held = false;
    int breaks = 0;
  };

  class HeldWatch : public Watch {
   public:
    HeldWatch(std::unique_ptr<Watch> inner, std::shared_ptr<Gate> gate)
        : inner_(std::move(inner)), gate_(std::move(gate)), breaks_at_start_(gate_->breaks) {}

    std::optional<WatchEvent> next(std::chrono::milliseconds timeout) override {
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      std::unique_lock lock(gate_->mutex);
      for (;;) {
        if (over_locked()) return std::nullopt;
        if (!gate_->held) break;
        if (gate_->changed.wait_until(lock, deadline) == std::cv_status::timeout &&
            (gate_->held || over_locked()))
          return std::nullopt;
      }
      if (!pending_.empty()) {
        WatchEvent event = std::move(pending_.front());
        pending_.pop_front();
        return event;
      }
      lock.unlock();
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      std::optional<WatchEvent> event = inner_->next(std::max(left, 0ms));
      if (!event) return std::nullopt;
      // Checked after the event arrived: one caused by a write after hold() is always held.
      lock.lock();
      if (over_locked()) return std::nullopt;
      if (gate_->held) {
        pending_.push_back(std::move(*event));
        return std::nullopt;
      }
      return event;
    }
    bool ended() const override {
      std::lock_guard lock(gate_->mutex);
      return over_locked() || (inner_->ended() && pending_.empty());
    }
    void stop() override {
      {
        std::lock_guard lock(gate_->mutex);
        stopped_ = true;
      }
      inner_->stop();
      gate_->changed.notify_all();
    }

   private:
    bool over_locked() const { return stopped_ || gate_->breaks > breaks_at_start_; }

    const std::unique_ptr<Watch> inner_;
    const std::shared_ptr<Gate> gate_;
    const int breaks_at_start_;
    std::deque<WatchEvent> pending_;  // guarded by gate_->mutex
    bool stopped_ = false;            // guarded by gate_->mutex
  };

  void set_held(bool held) {
    {
      std::lock_guard lock(gate_->mutex);
      gate_->held = held;
    }
    gate_->changed.notify_all();
  }

  const Resource lagging_;
  const std::shared_ptr<Gate> gate_ = std::make_shared<Gate>();
};

ListOptions with_labels(const std::string& selector) {
  ListOptions options;
  options.label_selector = selector;
  return options;
}

ListOptions with_fields(const std::string& selector) {
  ListOptions options;
  options.field_selector = selector;
  return options;
}

ListOptions paginated(std::int64_t limit) {
  ListOptions options;
  options.limit = limit;
  return options;
}

Object pod(const std::string& name, Object labels = Object::object(),
           const std::string& node = "") {
  Object spec = {{"containers", {{{"name", "c"}, {"image", "busybox"}}}}};
  if (!node.empty()) spec["nodeName"] = node;
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", {{"name", name}, {"labels", labels}}},
          {"spec", spec}};
}

Object config_map(const std::string& name, Object labels = Object::object()) {
  return {{"metadata", {{"name", name}, {"labels", labels}}}, {"data", {{"k", "v"}}}};
}

const std::string& version(const Object& object) {
  return object["metadata"]["resourceVersion"].get_ref<const std::string&>();
}

// "ns/name" -> resourceVersion of each object: what two answers must agree on.
std::map<std::string, std::string> versions(const std::vector<Object>& objects) {
  std::map<std::string, std::string> out;
  for (const Object& o : objects) {
    const std::string key = object_key(o);
    EXPECT_FALSE(out.count(key)) << "listed twice: " << key;
    out[key] = version(o);
  }
  return out;
}

std::string not_found_or_error(const std::function<void()>& call) {
  try {
    call();
  } catch (const ApiError& e) {
    return e.reason();
  }
  return "";
}

// Whether the informer of `r` holds `stored` at the Store's version.
bool cached_as_stored(const Cache& cache, const Resource& r, const Object& stored) {
  const auto cached =
      cache.informer(r)->get(stored["metadata"].value("namespace", ""), stored["metadata"]["name"]);
  return cached && version(*cached) == version(stored);
}

// ---- 1. answers equal the Store's, without a request ------------------------------------------

TEST(CachingClient, ListsAndGetsEqualTheStores_AndCachedReadsSendNoRequest) {
  local::Store store;
  const std::vector<std::string> namespaces = {"default", "team-a", "team-b"};
  const std::vector<std::string> jobs = {"a", "b", "c", ""};  // "": no job label
  const std::vector<std::string> roles = {"x", "y", ""};
  const std::vector<std::string> nodes = {"n1", "n2", ""};
  const unsigned seed = 20240611;
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  const auto pick = [&](const std::vector<std::string>& from) {
    return from[std::uniform_int_distribution<size_t>(0, from.size() - 1)(rng)];
  };
  const auto random_labels = [&] {
    Object labels = Object::object();
    if (const std::string job = pick(jobs); !job.empty()) labels[kJobLabel] = job;
    if (const std::string role = pick(roles); !role.empty()) labels["role"] = role;
    return labels;
  };
  // 48 pods: each name in two namespaces (pod-k is objects 2k and 2k+1, namespaces differ).
  for (int i = 0; i < 48; ++i)
    store.create(kPods, namespaces[i % 3],
                 pod("pod-" + std::to_string(i / 2), random_labels(), pick(nodes)));
  store.create(kConfigMaps, "default", config_map("labelled", {{kJobLabel, "a"}}));
  store.create(kConfigMaps, "default", config_map("unlabelled"));
  store.create(kConfigMaps, "team-a", config_map("elsewhere", {{kJobLabel, "a"}}));
  store.create(kServices, "default", {{"metadata", {{"name", "svc"}}}});

  Cache cache(store, fast_cache({{kPods, "", "", {kJobLabel}, {"spec.nodeName"}, {}},
                                 {kConfigMaps, "default", kJobLabel, {}, {}, {}}}));
  CountingClient api(store);
  CachingClient client(api, cache);
  cache.start();
  ASSERT_TRUE(wait_for([&] { return cache.has_synced(); }));

  // Changes after the first list, which the informer follows: relabels, deletions, new pods.
  const std::vector<Object> before = store.list(kPods, "", {}).items;
  for (int i = 0; i < 24; ++i) {
    Object target = before[std::uniform_int_distribution<size_t>(0, before.size() - 1)(rng)];
    const std::string ns = target["metadata"]["namespace"];
    const std::string name = target["metadata"]["name"];
    try {
      target = store.get(kPods, ns, name);
    } catch (const ApiError&) {
      continue;  // deleted earlier in this loop
    }
    if (i % 4 == 3) {
      store.remove(kPods, ns, name);
    } else {
      target["metadata"]["labels"] = random_labels();
      store.update(kPods, ns, target);
    }
  }
  for (int i = 0; i < 6; ++i)
    store.create(kPods, pick(namespaces),
                 pod("late-" + std::to_string(i), random_labels(), pick(nodes)));
  // The last change was a pod's: the informer is current when it has seen the Store's version.
  ASSERT_TRUE(wait_for(
      [&] { return cache.informer(kPods)->last_resource_version() == store.resource_version(); }));

  const std::vector<std::string> label_selectors = {
      "",
      "kubetrain.dev/job-name=a",  // an index
      "kubetrain.dev/job-name==b,role=x",
      "kubetrain.dev/job-name in (c)",  // an index, set-based
      "kubetrain.dev/job-name in (a,c)",
      "kubetrain.dev/job-name notin (a)",
      "!kubetrain.dev/job-name",
      "role",
      "role!=x"};
  const std::vector<std::string> field_selectors = {"",
                                                    "spec.nodeName=n1",
                                                    "spec.nodeName=",
                                                    "spec.nodeName!=n2",
                                                    "metadata.name=pod-3",
                                                    "metadata.namespace=team-b",
                                                    "metadata.name=pod-7,spec.nodeName=n2"};
  int nonempty = 0;
  for (const std::string ns : {"", "default", "team-a"})
    for (const std::string& labels : label_selectors)
      for (const std::string& fields : field_selectors) {
        SCOPED_TRACE("namespace \"" + ns + "\", labels \"" + labels + "\", fields \"" + fields +
                     "\"");
        ListOptions options;
        options.label_selector = labels;
        options.field_selector = fields;
        const auto want = versions(store.list(kPods, ns, options).items);
        EXPECT_EQ(versions(client.list(kPods, ns, options).items), want);
        nonempty += !want.empty();
      }
  EXPECT_GT(nonempty, 100);  // the selectors do select: the comparisons are not all of nothing

  int got = 0;
  for (const Object& stored : store.list(kPods, "", {}).items) {
    const Object answer =
        client.get(kPods, stored["metadata"]["namespace"], stored["metadata"]["name"]);
    EXPECT_EQ(version(answer), version(stored)) << object_key(stored);
    ++got;
  }
  EXPECT_GE(got, 40);
  // A name the cache lacks, in a collection it holds whole: NotFound, from the cache.
  EXPECT_EQ(not_found_or_error([&] { client.get(kPods, "default", "absent"); }), "NotFound");
  // An index read of the label-filtered ConfigMap informer (its selector is implied).
  EXPECT_EQ(
      versions(client.list(kConfigMaps, "default", with_labels("kubetrain.dev/job-name=a")).items),
      versions(store.list(kConfigMaps, "default", with_labels("kubetrain.dev/job-name=a")).items));
  EXPECT_EQ(version(client.get(kConfigMaps, "default", "labelled")),
            version(store.get(kConfigMaps, "default", "labelled")));
  EXPECT_EQ(api.reads(), 0) << api.gets << " get(s) and " << api.lists
                            << " list(s) reached the API";

  // What the cache cannot answer goes to the API, one request each, and is answered as the
  // Store answers it.
  const auto passes_through = [&](const std::string& what, int want_gets, int want_lists,
                                  const std::function<void()>& read) {
    SCOPED_TRACE(what);
    api.reset();
    read();
    EXPECT_EQ(api.gets, want_gets);
    EXPECT_EQ(api.lists, want_lists);
  };
  passes_through("a paginated list", 0, 1, [&] {
    const ObjectList page = client.list(kPods, "", paginated(5));
    EXPECT_EQ(page.items.size(), 5u);
    EXPECT_FALSE(page.continue_token.empty());
  });
  passes_through("a namespace the informer does not watch", 1, 1, [&] {
    EXPECT_EQ(versions(client.list(kConfigMaps, "team-a", {}).items),
              versions(store.list(kConfigMaps, "team-a", {}).items));
    EXPECT_EQ(version(client.get(kConfigMaps, "team-a", "elsewhere")),
              version(store.get(kConfigMaps, "team-a", "elsewhere")));
  });
  passes_through("a selector that does not imply the informer's", 0, 1, [&] {
    const auto all = versions(client.list(kConfigMaps, "default", {}).items);
    EXPECT_EQ(all, versions(store.list(kConfigMaps, "default", {}).items));
    EXPECT_TRUE(all.count("default/unlabelled"));
  });
  passes_through("a name a label-filtered informer lacks (it may lack the label)", 1, 0, [&] {
    EXPECT_EQ(version(client.get(kConfigMaps, "default", "unlabelled")),
              version(store.get(kConfigMaps, "default", "unlabelled")));
  });
  passes_through("a resource the cache does not hold", 1, 1, [&] {
    EXPECT_EQ(client.list(kServices, "default", {}).items.size(), 1u);
    EXPECT_EQ(version(client.get(kServices, "default", "svc")),
              version(store.get(kServices, "default", "svc")));
  });
}

// ---- 2. read-your-own-writes --------------------------------------------------------------------

TEST(CachingClient, ReadsItsOwnWritesAtOnce_BeforeTheInformerHasSeenThem) {
  local::Store store;
  LaggingClient lagging(store, kPods);
  Cache cache(lagging, fast_cache({{kPods, "default", "", {kJobLabel}, {}, {}}}));
  CountingClient api(store);
  CachingClient client(api, cache);
  const Object theirs = store.create(kPods, "default", pod("theirs", {{kJobLabel, "a"}}));
  cache.start();
  ASSERT_TRUE(wait_for([&] { return cache.has_synced(); }));
  const Informer& informer = *cache.informer(kPods);
  ASSERT_TRUE(cached_as_stored(cache, kPods, theirs));

  lagging.hold();
  const Object created = client.create(kPods, "default", pod("mine", {{kJobLabel, "a"}}));
  EXPECT_FALSE(informer.get("default", "mine"));  // the informer has not seen it: held
  EXPECT_EQ(version(client.get(kPods, "default", "mine")), version(created));
  const auto job_a = [&] {
    return versions(client.list(kPods, "default", with_labels("kubetrain.dev/job-name=a")).items);
  };
  EXPECT_EQ(job_a(), (std::map<std::string, std::string>{{"default/mine", version(created)},
                                                         {"default/theirs", version(theirs)}}));

  // An update that moves our pod out of job a's index and into b's.
  Object moved = created;
  moved["metadata"]["labels"][kJobLabel] = "b";
  moved = client.update(kPods, "default", moved);
  EXPECT_EQ(version(client.get(kPods, "default", "mine")), version(moved));
  EXPECT_EQ(job_a(), (std::map<std::string, std::string>{{"default/theirs", version(theirs)}}));
  EXPECT_EQ(versions(client.list(kPods, "default", with_labels("kubetrain.dev/job-name=b")).items),
            (std::map<std::string, std::string>{{"default/mine", version(moved)}}));

  // Writes to an object the informer holds at an older version: ours wins until it catches up.
  const Object patched =
      client.merge_patch(kPods, "default", "theirs", {{"metadata", {{"labels", {{"role", "x"}}}}}});
  EXPECT_EQ(version(*informer.get("default", "theirs")), version(theirs));  // still the old one
  EXPECT_EQ(version(client.get(kPods, "default", "theirs")), version(patched));
  EXPECT_EQ(versions(client.list(kPods, "default", with_labels("role=x")).items),
            (std::map<std::string, std::string>{{"default/theirs", version(patched)}}));
  Object running = patched;
  running["status"] = {{"phase", "Running"}};
  running = client.update_status(kPods, "default", running);
  EXPECT_EQ(client.get(kPods, "default", "theirs")["status"]["phase"], "Running");
  EXPECT_EQ(versions(client.list(kPods, "default", {}).items),
            (std::map<std::string, std::string>{{"default/mine", version(moved)},
                                                {"default/theirs", version(running)}}));
  EXPECT_EQ(api.reads(), 0) << "our writes were read back from the API, not from the cache";

  // Once the informer has caught up, a later write by someone else is read, not our old copy.
  lagging.release();
  ASSERT_TRUE(wait_for([&] {
    return cached_as_stored(cache, kPods, moved) && cached_as_stored(cache, kPods, running);
  }));
  Object by_someone_else = store.get(kPods, "default", "mine");
  by_someone_else["metadata"]["labels"]["role"] = "y";
  by_someone_else = store.update(kPods, "default", by_someone_else);
  EXPECT_TRUE(wait_for(
      [&] { return version(client.get(kPods, "default", "mine")) == version(by_someone_else); }));
  EXPECT_EQ(api.reads(), 0);
}

// ---- 3. a stale cache never makes a duplicate -----------------------------------------------

TEST(CachingClient, CreateAfterAStaleRead_IsAlreadyExists_AndTheStoreKeepsOneObject) {
  local::Store store;
  LaggingClient lagging(store, kPods);
  Cache cache(lagging, fast_cache({{kPods, "default", "", {kJobLabel}, {}, {}}}));
  CountingClient api(store);
  CachingClient client(api, cache);
  cache.start();
  ASSERT_TRUE(wait_for([&] { return cache.has_synced(); }));

  lagging.hold();
  // Someone else (another operator replica, or our own previous incarnation) makes the pod; the
  // informer has not delivered it.
  const Object theirs = store.create(kPods, "default", pod("job-worker-0", {{kJobLabel, "job"}}));

  // A reconcile's "create if missing", by the deterministic name.
  std::string outcome;
  try {
    client.get(kPods, "default", "job-worker-0");
    outcome = "found";
  } catch (const ApiError& e) {
    ASSERT_TRUE(e.not_found()) << e.what();
    try {
      client.create(kPods, "default", pod("job-worker-0", {{kJobLabel, "job"}}));
      outcome = "created";
    } catch (const ApiError& create_error) {
      outcome = create_error.already_exists() ? "AlreadyExists" : create_error.reason();
    }
  }
  EXPECT_EQ(api.gets, 0) << "the read was not the cache's: this test saw no stale read";
  EXPECT_EQ(outcome, "AlreadyExists");
  const auto named = store.list(kPods, "default", with_fields("metadata.name=job-worker-0"));
  ASSERT_EQ(named.items.size(), 1u);
  EXPECT_EQ(named.items[0]["metadata"]["uid"], theirs["metadata"]["uid"]);
  EXPECT_EQ(version(named.items[0]), version(theirs));

  lagging.release();
  EXPECT_TRUE(wait_for([&] { return cached_as_stored(cache, kPods, theirs); }));
  EXPECT_EQ(version(client.get(kPods, "default", "job-worker-0")), version(theirs));
}

// A TrainingJob whose plan is a gang of two CPU nodes.
Object two_node_job(const std::string& name) {
  return {{"apiVersion", "kubetrain.dev/v1alpha1"},
          {"kind", "TrainingJob"},
          {"metadata", {{"name", name}, {"namespace", "default"}}},
          {"spec",
           {{"model", {{"preset", "tiny"}}},
            {"training", {{"steps", 100}, {"globalBatchSize", 8}}},
            {"parallelism", {{"dataParallel", 2}}},
            {"resources", {{"cpuOnly", true}}},
            {"runPolicy", {{"backoffLimit", 2}}}}}};
}

void add_cpu_node(local::Store& store, const std::string& name) {
  Object node = store.create(
      kNodes, "", {{"metadata", {{"name", name}, {"labels", {{"kubernetes.io/hostname", name}}}}}});
  node["status"] = {{"allocatable", {{"cpu", "4"}, {"memory", "16Gi"}}},
                    {"capacity", {{"cpu", "4"}, {"memory", "16Gi"}}}};
  store.update_status(kNodes, "", node);
}

std::set<std::string> pod_names(local::Store& store) {
  std::set<std::string> names;
  for (const Object& p : store.list(kPods, "default", {}).items)
    names.insert(p["metadata"]["name"].get<std::string>());
  return names;
}

TEST(CachingClient, JobReconciledThroughALaggingPodCache_KeepsExactlyItsGang) {
  local::Store store;
  store.register_resource(kTrainingJobs, true);
  add_cpu_node(store, "node-a");
  add_cpu_node(store, "node-b");
  LaggingClient lagging(store, kPods);
  Cache cache(lagging, controller::operator_cache_options("default", fast_timing()));
  // Two clients of one cache: the second has no memory of the first's writes (another worker,
  // or the operator after a restart), so it reads the lagging pod informer as it is.
  CachingClient first_client(store, cache);
  CachingClient second_client(store, cache);
  controller::Controller first(first_client, {});
  controller::Controller second(second_client, {});
  cache.start();
  ASSERT_TRUE(wait_for([&] { return cache.has_synced(); }));
  const Object job = store.create(kTrainingJobs, "default", two_node_job("job"));
  ASSERT_TRUE(wait_for([&] { return cached_as_stored(cache, kTrainingJobs, job); }));

  lagging.hold();
  first.reconcile("default", "job");
  const std::set<std::string> gang = {"job-worker-0", "job-worker-1"};
  ASSERT_EQ(pod_names(store), gang);
  ASSERT_TRUE(cache.informer(kPods)->list().empty());  // the pod informer lags

  first.reconcile("default", "job");  // reads its own creates
  EXPECT_EQ(pod_names(store), gang);

  // The second sees the job, its status and its plan as the store has them, but no pod.
  ASSERT_TRUE(wait_for([&] {
    return cached_as_stored(cache, kTrainingJobs, store.get(kTrainingJobs, "default", "job")) &&
           cached_as_stored(cache, kConfigMaps, store.get(kConfigMaps, "default", "job-plan"));
  }));
  ASSERT_TRUE(cache.informer(kPods)->list().empty());
  const controller::ReconcileResult stale = second.reconcile("default", "job");
  EXPECT_EQ(pod_names(store), gang);
  EXPECT_TRUE(stale.requeue_after) << "names taken by pods it did not see: look again soon";
  for (const Object& p : store.list(kPods, "default", {}).items)
    EXPECT_EQ(p["metadata"]["labels"]["kubetrain.dev/restart-attempt"], "0") << p.dump();

  lagging.release();
  ASSERT_TRUE(wait_for([&] { return cache.informer(kPods)->list().size() == 2; }));
  second.reconcile("default", "job");
  EXPECT_EQ(pod_names(store), gang);
}

// ---- 4. a deletion missed while the watch was down ---------------------------------------------

TEST(CachingClient, ObjectDeletedWhileTheWatchWasDown_IsGoneAfterTheRelist) {
  // A short history, so that the informer's resourceVersion is compacted away: 410 Gone.
  local::StoreOptions short_history;
  short_history.history_limit = 8;
  local::Store store(short_history);
  LaggingClient lagging(store, kConfigMaps);
  Cache cache(lagging, fast_cache({{kConfigMaps, "default", "", {}, {}, {}}}));
  std::mutex deleted_mutex;
  std::set<std::string> deleted;
  cache.informer(kConfigMaps)->add_handler([&](WatchEventType type, const Object& object) {
    std::lock_guard lock(deleted_mutex);
    if (type == WatchEventType::Deleted)
      deleted.insert(object["metadata"]["name"].get<std::string>());
  });
  CountingClient api(store);
  CachingClient client(api, cache);
  store.create(kConfigMaps, "default", config_map("doomed"));
  Object kept = store.create(kConfigMaps, "default", config_map("kept"));
  cache.start();
  ASSERT_TRUE(wait_for([&] { return cache.has_synced(); }));
  const Informer& informer = *cache.informer(kConfigMaps);
  const int lists_before = informer.lists();

  lagging.hold();
  store.remove(kConfigMaps, "default", "doomed");
  for (int i = 0; i < 12; ++i) {  // more changes than the history keeps
    kept["data"]["k"] = std::to_string(i);
    kept = store.update(kConfigMaps, "default", kept);
  }
  EXPECT_TRUE(informer.get("default", "doomed"));  // missed: the watch held the deletion
  try {  // and resuming from where the informer stands is no longer possible
    WatchOptions from_informer;
    from_informer.resource_version = informer.last_resource_version();
    store.watch(kConfigMaps, "default", from_informer);
    ADD_FAILURE() << "the store still has the history after " << informer.last_resource_version();
  } catch (const ApiError& e) {
    EXPECT_TRUE(e.gone()) << e.what();
  }

  lagging.break_watches();  // the held events are lost with the connection
  ASSERT_TRUE(wait_for([&] {
    return informer.lists() > lists_before && !informer.get("default", "doomed");
  })) << "no relist after the watch broke with its version compacted";
  EXPECT_TRUE(cached_as_stored(cache, kConfigMaps, kept));
  EXPECT_EQ(not_found_or_error([&] { client.get(kConfigMaps, "default", "doomed"); }), "NotFound");
  EXPECT_EQ(versions(client.list(kConfigMaps, "default", {}).items),
            (std::map<std::string, std::string>{{"default/kept", version(kept)}}));
  EXPECT_EQ(api.reads(), 0);
  {
    std::lock_guard lock(deleted_mutex);
    EXPECT_EQ(deleted, std::set<std::string>{"doomed"});  // handlers heard of it too
  }
  lagging.release();
}

// ---- 5. steady state: no LIST ----------------------------------------------------------------

TEST(CachingClient, SteadyStateReconciles_SendTheApiNoReadAndNoWrite) {
  local::Store store;
  store.register_resource(kTrainingJobs, true);
  add_cpu_node(store, "node-a");
  add_cpu_node(store, "node-b");
  Cache cache(store, controller::operator_cache_options("default", fast_timing()));
  CountingClient api(store);
  CachingClient client(api, cache);
  telemetry::Registry registry;
  controller::ControllerMetrics metrics(registry);
  controller::ControllerOptions options;
  options.metrics = &metrics;
  controller::Controller controller(client, options);
  controller::ManagerOptions manager_options;
  manager_options.ns = "default";
  manager_options.workers = 2;
  manager_options.controller_metrics = &metrics;
  controller::Manager manager(cache, controller, manager_options);
  manager.start();
  ASSERT_TRUE(wait_for([&] { return manager.has_synced(); }));
  store.create(kTrainingJobs, "default", two_node_job("steady"));

  // Steady: the gang exists, the job says so, and every informer holds what the store has.
  const auto steady = [&] {
    const Object job = store.get(kTrainingJobs, "default", "steady");
    if (job.value("status", Object::object()).value("phase", "") != "Starting") return false;
    if (!cached_as_stored(cache, kTrainingJobs, job)) return false;
    if (pod_names(store) != std::set<std::string>{"steady-worker-0", "steady-worker-1"})
      return false;
    for (const Resource& r : {kPods, kConfigMaps, kServices, kPersistentVolumeClaims})
      for (const Object& o : store.list(r, "default", {}).items)
        if (!cached_as_stored(cache, r, o)) return false;
    return true;
  };
  ASSERT_TRUE(wait_for(steady)) << store.get(kTrainingJobs, "default", "steady").dump();
  ASSERT_GT(api.reads(), 0);  // the first reconcile did ask (the plan's inventory, absent children)
  api.reset();
  const auto reconciles = [&] {
    return metrics.reconcile_time_seconds.with({"trainingjob"}).snapshot().count;
  };
  const auto plans = [&] { return metrics.planner_duration_seconds.snapshot().count; };
  const auto plans_before = plans();

  for (int i = 0; i < 3; ++i) {  // by the manager's workers
    const auto before = reconciles();
    manager.enqueue("default", "steady");
    ASSERT_TRUE(wait_for([&] { return reconciles() > before; }));
  }
  for (int i = 0; i < 3; ++i) {  // and on this thread, where the client counts its requests
    const std::int64_t before = CachingClient::api_requests_on_this_thread();
    const controller::ReconcileResult result = controller.reconcile("default", "steady");
    EXPECT_EQ(CachingClient::api_requests_on_this_thread() - before, 0) << "reconcile " << i;
    EXPECT_FALSE(result.requeue_after);
  }
  EXPECT_EQ(api.gets, 0);
  EXPECT_EQ(api.lists, 0);
  EXPECT_EQ(api.writes(), 0) << api.status_updates << " status update(s), " << api.creates
                             << " create(s), " << api.updates << " update(s)";
  EXPECT_EQ(plans(), plans_before) << "a steady-state reconcile planned again";
  manager.stop();
  EXPECT_EQ(pod_names(store), (std::set<std::string>{"steady-worker-0", "steady-worker-1"}));
}

}  // namespace
}  // namespace kt::kube
