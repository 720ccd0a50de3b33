// The informer over real sockets against `kubetrain local serve`: it syncs, follows changes,
// and converges on the store's state through dropped watches, 410s, ERROR events, 5xx and slow
// responses, including deletions it missed while disconnected.
#include "operator/kube/informer.h"

#include <gtest/gtest.h>

#include <set>

#include "tests/kube/local_server.h"
#include "tests/support/eventually.h"

using namespace std::chrono_literals;
using namespace kt::kube;
using kt::kube::testing::config_map;
using kt::kube::testing::LocalServer;
using kt::test::eventually;

namespace {

// Short backoffs so that tests spend their time on behaviour, not on waiting.
InformerTiming fast_timing() {
  InformerTiming t;
  t.initial_backoff = 50ms;
  t.max_backoff = 400ms;
  t.page_size = 3;  // exercise pagination
  return t;
}

// What the handlers saw, folded into a state: the handler-side view of the cache.
struct Recorder {
  std::mutex mutex;
  std::map<std::string, std::string> data;  // name -> data.key
  int deletes = 0;

  void operator()(WatchEventType type, const Object& object) {
    std::lock_guard lock(mutex);
    const std::string name = object["metadata"]["name"];
    if (type == WatchEventType::Deleted) {
      data.erase(name);
      ++deletes;
    } else {
      data[name] = object["data"].value("key", "");
    }
  }
  std::map<std::string, std::string> snapshot() {
    std::lock_guard lock(mutex);
    return data;
  }
};

std::map<std::string, std::string> cache_state(const Informer& informer) {
  std::map<std::string, std::string> out;
  for (const Object& o : informer.list()) out[o["metadata"]["name"]] = o["data"].value("key", "");
  return out;
}

std::map<std::string, std::string> store_state(Client& store) {
  std::map<std::string, std::string> out;
  for (const Object& o : store.list(kConfigMaps, "default", {}).items) {
    out[o["metadata"]["name"]] = o["data"].value("key", "");
  }
  return out;
}

// True once the informer's cache and its handlers' view both equal the store.
bool converged(Informer& informer, Recorder& recorder, Client& store) {
  const auto truth = store_state(store);
  return cache_state(informer) == truth && recorder.snapshot() == truth;
}

}  // namespace

TEST(Informer, SyncsExistingObjectsAcrossPagesAndFollowsChanges) {
  LocalServer local;
  for (int i = 0; i < 7; ++i) local.store.create(kConfigMaps, "default", config_map("cm" + std::to_string(i)));
  auto client = local.client();
  Informer informer(*client, kConfigMaps, "default", "app=kt", fast_timing());
  Recorder recorder;
  informer.add_handler(std::ref(recorder));
  informer.start();
  ASSERT_TRUE(eventually([&] { return informer.has_synced(); }));
  EXPECT_EQ(informer.list().size(), 7u);

  local.store.create(kConfigMaps, "default", config_map("late", "x"));
  local.store.merge_patch(kConfigMaps, "default", "cm0", {{"data", {{"key", "changed"}}}});
  local.store.remove(kConfigMaps, "default", "cm1");
  Object unlabelled = config_map("other");
  unlabelled["metadata"]["labels"]["app"] = "else";
  local.store.create(kConfigMaps, "default", unlabelled);
  ASSERT_TRUE(eventually([&] {
    const auto cm0 = informer.get("default", "cm0");
    return informer.get("default", "late") && !informer.get("default", "cm1") && cm0 &&
           (*cm0)["data"]["key"] == "changed";
  }));
  EXPECT_FALSE(informer.get("default", "other")) << "outside the label selector";
  EXPECT_EQ(recorder.snapshot().size(), 7u);
  informer.stop();
}

TEST(Informer, ConvergesThroughDroppedWatchesWhileObjectsChange) {
  LocalServer local;
  auto client = local.client();
  Informer informer(*client, kConfigMaps, "default", "", fast_timing());
  Recorder recorder;
  informer.add_handler(std::ref(recorder));
  informer.start();
  ASSERT_TRUE(eventually([&] { return informer.has_synced(); }));
  for (int round = 0; round < 5; ++round) {
    for (int i = 0; i < 4; ++i) {
      const std::string name = "cm" + std::to_string((round * 4 + i) % 6);
      try {
        local.store.create(kConfigMaps, "default", config_map(name, std::to_string(round)));
      } catch (const ApiError&) {
        local.store.remove(kConfigMaps, "default", name);
      }
    }
    local.server.drop_watches();
    std::this_thread::sleep_for(30ms);
  }
  EXPECT_TRUE(eventually([&] { return converged(informer, recorder, local.store); }));
  EXPECT_GE(informer.watches(), 2) << "it watched again after the drops";
  informer.stop();
}

TEST(Informer, RelistsOnGoneAndOnErrorEventsAndEmitsMissedDeletions) {
  LocalServer local;
  for (int i = 0; i < 4; ++i) local.store.create(kConfigMaps, "default", config_map("cm" + std::to_string(i)));
  auto client = local.client();
  Informer informer(*client, kConfigMaps, "default", "", fast_timing());
  Recorder recorder;
  informer.add_handler(std::ref(recorder));
  informer.start();
  ASSERT_TRUE(eventually([&] { return informer.has_synced() && informer.list().size() == 4; }));
  const int lists_before = informer.lists();

  // Disconnected: every request fails with 500 while objects are deleted and changed behind
  // the informer's back; then the history is "compacted" (the next watch gets 410).
  local.server.set_faults({.watch_gone = 1, .server_errors = 1000});
  local.server.drop_watches();
  // The changes below are made once the informer has been refused at least once.
  ASSERT_TRUE(eventually([&] { return local.server.faults().server_errors < 1000; }));
  local.store.remove(kConfigMaps, "default", "cm0");
  local.store.remove(kConfigMaps, "default", "cm1");
  local.store.merge_patch(kConfigMaps, "default", "cm2", {{"data", {{"key", "new"}}}});
  local.store.create(kConfigMaps, "default", config_map("cm9"));
  auto faults = local.server.faults();
  faults.server_errors = 0;
  local.server.set_faults(faults);

  EXPECT_TRUE(eventually([&] { return converged(informer, recorder, local.store); }));
  EXPECT_GT(informer.lists(), lists_before) << "410 makes it list again";
  EXPECT_EQ(recorder.deletes, 2) << "deletions missed while disconnected arrive as Deleted";

  // An ERROR event in a watch stream relists too.
  const int lists_mid = informer.lists();
  local.server.set_faults({.watch_expired = 1});
  local.server.drop_watches();
  local.store.remove(kConfigMaps, "default", "cm3");
  EXPECT_TRUE(eventually([&] {
    return informer.lists() > lists_mid && converged(informer, recorder, local.store);
  }));
  informer.stop();
}

TEST(Informer, SyncsThroughFailingListsAndSlowResponses) {
  LocalServer local;
  for (int i = 0; i < 3; ++i) local.store.create(kConfigMaps, "default", config_map("cm" + std::to_string(i)));
  local.server.set_faults({.server_errors = 3, .delay = 150ms});
  auto client = local.client();
  Informer informer(*client, kConfigMaps, "default", "", fast_timing());
  Recorder recorder;
  informer.add_handler(std::ref(recorder));
  informer.start();
  ASSERT_TRUE(eventually([&] { return informer.has_synced(); }));
  EXPECT_EQ(local.server.faults().server_errors, 0) << "the failures were met and retried";
  local.store.create(kConfigMaps, "default", config_map("after"));
  EXPECT_TRUE(eventually([&] { return converged(informer, recorder, local.store); }));
  informer.stop();
}

TEST(Informer, WatchesAgainWhenTheServerEndsAWatchAtItsTimeout) {
  LocalServer local;
  auto client = local.client();
  InformerTiming timing = fast_timing();
  timing.min_watch_timeout_seconds = 1;  // the server closes each watch after 1 s
  timing.max_watch_timeout_seconds = 1;
  Informer informer(*client, kConfigMaps, "default", "", timing);
  Recorder recorder;
  informer.add_handler(std::ref(recorder));
  informer.start();
  ASSERT_TRUE(eventually([&] { return informer.has_synced(); }));
  ASSERT_TRUE(eventually([&] { return informer.watches() >= 3; }));
  EXPECT_EQ(informer.lists(), 1) << "an ended watch resumes from its version, without a list";
  local.store.create(kConfigMaps, "default", config_map("after-timeouts"));
  EXPECT_TRUE(eventually([&] { return converged(informer, recorder, local.store); }));
  informer.stop();
}

TEST(Informer, StopReturnsPromptlyWhileBackingOff) {
  LocalServer local;
  local.server.set_faults({.server_errors = 1'000'000});
  auto client = local.client();
  InformerTiming slow;  // the production 0.8 s → 30 s backoff
  Informer informer(*client, kConfigMaps, "default", "", slow);
  informer.start();
  // Two requests refused: it is in its second backoff.
  ASSERT_TRUE(eventually([&] { return local.server.faults().server_errors <= 1'000'000 - 2; }));
  const auto before = std::chrono::steady_clock::now();
  informer.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - before, 3s);
  EXPECT_FALSE(informer.has_synced());
}
