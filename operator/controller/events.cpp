#include "operator/controller/events.h"

#include <cstdio>
#include <string>
#include <utility>

#include "api/error.h"
#include "operator/kube/objects.h"

namespace kt::controller {

std::string logfmt_quoted(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

void create_event(kube::Client& client, const kube::Object& event) {
  const kube::Object& meta = event.at("metadata");
  const std::string ns = meta.value("namespace", "default");
  try {
    client.create(kube::kEvents, ns, event);
  } catch (const kt::Error& e) {
    const kube::Object& about = event.value("involvedObject", kube::Object::object());
    std::fprintf(stderr,
                 "ts=%s level=error msg=\"server rejected event (will not retry)\" object=%s/%s "
                 "reason=%s err=%s\n",
                 kube::now_rfc3339().c_str(), ns.c_str(), about.value("name", "").c_str(),
                 event.value("reason", "").c_str(), logfmt_quoted(e.what()).c_str());
  }
}

EventRecorder::EventRecorder(kube::Client& client, std::size_t max_queued)
    : client_(client), max_queued_(max_queued), thread_([this] { run(); }) {}

EventRecorder::~EventRecorder() {
  stop();
}

void EventRecorder::record(kube::Object event) {
  // Every event is also a log line: what the operator decided (a plan chosen, a restart, a job
  // that succeeded or failed) is in its log even where Events expire after an hour.
  {
    const kube::Object& about = event.value("involvedObject", kube::Object::object());
    std::fprintf(stderr, "ts=%s level=%s msg=\"event\" object=%s/%s kind=%s reason=%s message=%s\n",
                 kube::now_rfc3339().c_str(), event.value("type", "") == "Warning" ? "warn" : "info",
                 about.value("namespace", "").c_str(), about.value("name", "").c_str(),
                 about.value("kind", "").c_str(), event.value("reason", "").c_str(),
                 logfmt_quoted(event.value("message", "")).c_str());
  }
  std::lock_guard lock(mutex_);
  if (stopping_ || queue_.size() >= max_queued_) {
    // Said on the first drop and then every 100th, not once per Event.
    if (dropped_++ % 100 == 0)
      std::fprintf(stderr,
                   "ts=%s level=error msg=\"event queue full or stopped; dropping events\" "
                   "dropped=%zu max_queued=%zu\n",
                   kube::now_rfc3339().c_str(), dropped_, max_queued_);
    return;
  }
  queue_.push_back(std::move(event));
  wake_.notify_one();
}

void EventRecorder::flush() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return queue_.empty() && !sending_; });
}

void EventRecorder::stop(std::chrono::milliseconds drain) {
  {
    std::lock_guard lock(mutex_);
    if (!stopping_) {
      stopping_ = true;
      drain_until_ = std::chrono::steady_clock::now() + drain;
    }
    wake_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

void EventRecorder::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty() || (stopping_ && std::chrono::steady_clock::now() >= drain_until_)) {
      dropped_ += queue_.size();
      queue_.clear();
      idle_.notify_all();
      if (stopping_) return;
      continue;
    }
    kube::Object event = std::move(queue_.front());
    queue_.pop_front();
    sending_ = true;
    lock.unlock();
    create_event(client_, event);
    lock.lock();
    sending_ = false;
    if (queue_.empty()) idle_.notify_all();
  }
}

}  // namespace kt::controller
