// The event recorder (operator/controller/events.h): Events are created off the caller's thread,
// in the order recorded; at most max_queued wait (more are dropped); stop() sends what is queued;
// a rejected Event is logged, never thrown at the reconcile.
#include "operator/controller/events.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "local/store.h"
#include "tests/support/forwarding_client.h"

namespace kt::controller {
namespace {

using kube::Object;

Object event(const std::string& reason) {
  return {{"apiVersion", "v1"},
          {"kind", "Event"},
          {"metadata", {{"generateName", "job."}, {"namespace", "default"}}},
          {"involvedObject", {{"kind", "TrainingJob"}, {"name", "job"}, {"namespace", "default"}}},
          {"type", "Normal"},
          {"reason", reason},
          {"message", "m"}};
}

// Event creates wait at a gate the test opens; the reasons are kept in the order created.
class GatedEvents : public test::ForwardingClient {
 public:
  using ForwardingClient::ForwardingClient;
  Object create(const kube::Resource& r, const std::string& ns, const Object& obj) override {
    if (!(r == kube::kEvents)) return inner_.create(r, ns, obj);
    std::unique_lock lock(mutex_);
    ++waiting_;
    changed_.notify_all();
    changed_.wait(lock, [&] { return open_; });
    --waiting_;
    created_.push_back(obj.value("reason", ""));
    if (obj.value("reason", "") == "Rejected")
      throw kube::ApiError(422, "Invalid", "events \"x\" is invalid");
    return obj;
  }
  void open() {
    std::lock_guard lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }
  void wait_for_a_create() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return waiting_ > 0; });
  }
  std::vector<std::string> created() {
    std::lock_guard lock(mutex_);
    return created_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool open_ = false;
  int waiting_ = 0;
  std::vector<std::string> created_;
};

TEST(EventRecorder, RecordReturnsAtOnce_EventsAreCreatedInOrder) {
  local::Store store;
  GatedEvents gated(store);
  EventRecorder recorder(gated);
  // Every create is held at the gate, yet record() returns: the reconcile does not wait.
  for (const char* reason : {"A", "B", "C"}) recorder.record(event(reason));
  gated.wait_for_a_create();
  EXPECT_TRUE(gated.created().empty());
  gated.open();
  recorder.flush();
  EXPECT_EQ(gated.created(), (std::vector<std::string>{"A", "B", "C"}));
}

TEST(EventRecorder, DropsWhatExceedsTheQueue_KeepsTheRest) {
  local::Store store;
  GatedEvents gated(store);
  EventRecorder recorder(gated, 2);
  recorder.record(event("in-flight"));
  gated.wait_for_a_create();  // taken off the queue, held at the gate
  for (const char* reason : {"q1", "q2", "dropped-1", "dropped-2"}) recorder.record(event(reason));
  gated.open();
  recorder.flush();
  EXPECT_EQ(gated.created(), (std::vector<std::string>{"in-flight", "q1", "q2"}));
}

TEST(EventRecorder, ARejectedEventIsLogged_TheNextOnesAreStillSent) {
  local::Store store;
  GatedEvents gated(store);
  EventRecorder recorder(gated);
  gated.open();
  recorder.record(event("Rejected"));
  recorder.record(event("After"));
  recorder.flush();
  EXPECT_EQ(gated.created(), (std::vector<std::string>{"Rejected", "After"}));
}

TEST(EventRecorder, StopSendsWhatIsQueued_ThenRecordDrops) {
  local::Store store;
  EventRecorder recorder(store);
  for (int i = 0; i < 20; ++i) recorder.record(event("R" + std::to_string(i)));
  recorder.stop();
  EXPECT_EQ(store.list(kube::kEvents, "default", {}).items.size(), 20u);
  recorder.record(event("late"));
  recorder.flush();
  EXPECT_EQ(store.list(kube::kEvents, "default", {}).items.size(), 20u);
}

}  // namespace
}  // namespace kt::controller
