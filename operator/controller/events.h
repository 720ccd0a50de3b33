// Kubernetes Events sent off the reconcile path, as client-go's recorder sends them: a reconcile
// queues the Event and goes on, one thread creates them in the order queued. Best effort, as in
// client-go: at most `max_queued` wait (more are dropped, and the drop is logged), a rejected
// Event is logged and not retried, and stop() sends what is queued for up to a deadline.
//
//   EventRecorder events(client);
//   events.record(event_object);  // returns at once
//   ...
//   events.stop();                // on shutdown: the queued ones are sent (for up to 5 s)
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <thread>

#include "operator/kube/client.h"

namespace kt::controller {

// Creates `event` (a v1 Event with metadata.namespace) now; a rejection is logged, not thrown.
void create_event(kube::Client& client, const kube::Object& event);

// `text` as a logfmt value: quoted, with quotes, backslashes and line breaks escaped.
std::string logfmt_quoted(const std::string& text);

class EventRecorder {
 public:
  explicit EventRecorder(kube::Client& client, std::size_t max_queued = 1000);
  ~EventRecorder();
  EventRecorder(const EventRecorder&) = delete;
  EventRecorder& operator=(const EventRecorder&) = delete;

  void record(kube::Object event);
  // Returns once every Event recorded before the call has been sent (or rejected).
  void flush();
  // Sends what is queued for up to `drain`, then drops the rest; record() drops after it.
  void stop(std::chrono::milliseconds drain = std::chrono::seconds(5));

 private:
  void run();

  kube::Client& client_;
  const std::size_t max_queued_;
  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<kube::Object> queue_;
  bool sending_ = false;  // the thread holds an Event taken from the queue
  bool stopping_ = false;
  std::chrono::steady_clock::time_point drain_until_{};
  std::size_t dropped_ = 0;
  std::thread thread_;
};

}  // namespace kt::controller
