// The REST path's throughput and latency on this machine: RestClient against
// `kubetrain local serve` (the Store behind the socket server) over 127.0.0.1.
//   bench_kube [objects]   (default 1000)
// Prints creates/s, GETs/s, a full list, an informer's sync, and the watch latency from a write
// to the informer's handler.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "operator/kube/informer.h"
#include "operator/kube/rest_client.h"
#include "local/http_api.h"
#include "local/store.h"

using namespace kt::kube;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

Object config_map(int i) {
  return {{"apiVersion", "v1"},
          {"kind", "ConfigMap"},
          {"metadata", {{"name", "cm-" + std::to_string(i)}, {"namespace", "default"}}},
          {"data", {{"key", std::string(200, 'x')}}}};
}

}  // namespace

int main(int argc, char** argv) {
  const int objects = argc > 1 ? std::atoi(argv[1]) : 1000;
  kt::local::Store store;
  kt::local::ApiServer server(store);
  server.start();
  Config config;
  config.server = server.url();
  RestClient client(config);

  auto start = Clock::now();
  for (int i = 0; i < objects; ++i) client.create(kConfigMaps, "default", config_map(i));
  const double create_s = seconds_since(start);

  start = Clock::now();
  const int gets = 2 * objects;
  for (int i = 0; i < gets; ++i) client.get(kConfigMaps, "default", "cm-" + std::to_string(i % objects));
  const double get_s = seconds_since(start);

  start = Clock::now();
  const ObjectList all = client.list(kConfigMaps, "default", {});
  const double list_s = seconds_since(start);

  // An informer's sync (paginated list, 500 per page) and its watch latency.
  std::mutex mutex;
  std::condition_variable seen_cv;
  std::string awaited;
  Clock::time_point seen_at;
  Informer informer(client, kConfigMaps, "default", "");
  informer.add_handler([&](WatchEventType, const Object& o) {
    std::lock_guard lock(mutex);
    if (o["metadata"]["name"] == awaited) {
      seen_at = Clock::now();
      seen_cv.notify_all();
    }
  });
  start = Clock::now();
  informer.start();
  while (!informer.has_synced()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const double sync_s = seconds_since(start);

  std::vector<double> latencies_ms;
  for (int i = 0; i < 200; ++i) {
    Object cm = config_map(objects + i);
    {
      std::lock_guard lock(mutex);
      awaited = cm["metadata"]["name"];
      seen_at = {};
    }
    const auto written = Clock::now();
    store.create(kConfigMaps, "default", cm);  // straight into the store: only the watch path
    std::unique_lock lock(mutex);
    if (!seen_cv.wait_for(lock, std::chrono::seconds(10), [&] { return seen_at != Clock::time_point{}; })) {
      std::fprintf(stderr, "event %d not seen within 10 s\n", i);
      return 1;
    }
    latencies_ms.push_back(std::chrono::duration<double, std::milli>(seen_at - written).count());
  }
  informer.stop();
  std::sort(latencies_ms.begin(), latencies_ms.end());

  std::printf("kube REST path over 127.0.0.1 (%d ConfigMaps of ~200 B)\n", objects);
  std::printf("  create (POST)        %8.0f /s\n", objects / create_s);
  std::printf("  get (GET)            %8.0f /s\n", gets / get_s);
  std::printf("  list all (%zu items) %8.1f ms\n", all.items.size(), list_s * 1e3);
  std::printf("  informer sync        %8.1f ms\n", sync_s * 1e3);
  std::printf("  watch latency        p50 %.2f ms, p90 %.2f ms, max %.2f ms (write to handler)\n",
              latencies_ms[latencies_ms.size() / 2], latencies_ms[latencies_ms.size() * 9 / 10],
              latencies_ms.back());
  return 0;
}
