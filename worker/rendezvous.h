// The rendezvous store of a job (docs/WORKER.md, "Processes"): a small TCP key-value store that
// rank 0 hosts and every rank reaches at MASTER_ADDR:MASTER_PORT. Gloo has no TCP store
// (docs/ARCHITECTURE.md §8), and a shared directory (FileStore) does not exist across pods, so this
// is ours.
//
//   TcpStoreServer server(29500);                        // rank 0 only; throws if the port is
//   taken TcpStore store("10.0.0.5", 29500, std::chrono::seconds(60));   // every rank
//   store.set("job/world_size/3", {'4'});
//   store.wait({"job/world_size/0"});                    // blocks until set, or throws
//
// Protocol: one TCP connection per client; requests and replies are length-prefixed (u32, big
// endian) strings. Values are bytes. Waits block on the server, so clients do not poll.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace kt::worker {

// Serves the store on a thread, with one thread per client connection (world sizes are small).
class TcpStoreServer {
 public:
  // Listens on `address`:`port` (port 0: a free port, see port()). Throws
  // kt::Error("cannot listen on :PORT for the rendezvous: why") when it cannot.
  explicit TcpStoreServer(int port, const std::string& address = "0.0.0.0");
  ~TcpStoreServer();  // closes every connection and joins the threads
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A client of TcpStoreServer, usable as Gloo's rendezvous store. Thread-safe (one request at a
// time on the connection).
class TcpStore : public gloo::rendezvous::Store {
 public:
  // Connects, retrying every 100–500 ms for up to `timeout` (rank 0 may start later than the
  // others), then throws kt::Error("rendezvous: no store at HOST:PORT after Ns (...)").
  // `timeout` is also the default for get() and wait().
  TcpStore(std::string host, int port, std::chrono::milliseconds timeout);
  ~TcpStore() override;

  void set(const std::string& key, const std::vector<char>& data) override;
  // Blocks until `key` exists, up to the timeout.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  // Throws kt::Error naming the keys still missing after `timeout`.
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // Once set, every wait (also the ones Gloo makes inside connectFullMesh) fails as soon as
  // this key exists, with its value as the message: a rank that finds the job misconfigured
  // sets it so the others fail at once with the reason instead of timing out.
  void set_abort_key(std::string key);

  const std::string& endpoint() const { return endpoint_; }  // "HOST:PORT"

 private:
  // Sends one request and returns the reply; throws kt::Error if the connection broke.
  std::vector<std::string> call(const std::vector<std::string>& request,
                                std::chrono::milliseconds reply_within);

  std::string endpoint_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  int fd_ = -1;
  std::string abort_key_;
};

}  // namespace kt::worker
