// libFuzzer harness: the watch stream the operator's REST client reads from the API server
// (operator/kube/objects.h parse_watch_event, operator/kube/informer.h object_key). Input: the
// stream, one JSON frame per line. Each frame must give an event or be refused with kt::Error
// (the watch then ends and the informer watches again); an event must give the informer its
// cache key, and its frame must read back as the same event.
//   fuzz/run.sh watch_stream 60
#include <cstddef>
#include <cstdint>
#include <string>

#include "api/error.h"
#include "fuzz/fuzz_check.h"
#include "operator/kube/informer.h"
#include "operator/kube/objects.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kt::kube::WatchEvent;
  using kt::kube::WatchEventType;
  for (const std::string& line : kt::fuzz::split(kt::fuzz::as_text(data, size), '\n', 1000)) {
    if (line.empty()) continue;
    WatchEvent event;
    try {
      event = kt::kube::parse_watch_event(line);
    } catch (const kt::Error&) {
      continue;
    }
    const std::string frame = kt::kube::watch_event_line(event);
    if (event.type == WatchEventType::Error) {
      (void)event.object.dump();
    } else if (event.type != WatchEventType::Bookmark) {
      FUZZ_CHECK(!kt::kube::object_key(event.object).empty(), frame);
    }
    WatchEvent again;
    try {
      again = kt::kube::parse_watch_event(frame);
    } catch (const kt::Error& e) {
      FUZZ_CHECK(false, std::string("an event's own frame is refused: ") + e.what() + "\n" + frame);
    }
    FUZZ_CHECK(again.type == event.type && again.object == event.object, frame);
  }
  return 0;
}
