// The HTTP client adapter: TLS (CA file or PEM data, client certificates, insecure mode)
// against `openssl s_server`, the request timeout, and cancellation.
#include "operator/kube/http_client.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "api/error.h"
#include "tests/kube/local_server.h"
#include "tests/support/eventually.h"

extern char** environ;

using namespace std::chrono_literals;
using namespace kt::kube;
namespace fs = std::filesystem;

namespace {

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(addr);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length);
  ::close(fd);
  return ntohs(addr.sin_port);
}

bool accepts_connections(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

std::string slurp(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A CA, a server certificate for 127.0.0.1 and a client certificate, made with the openssl
// command; and `openssl s_server -www` requiring a client certificate signed by that CA.
class TlsServer : public ::testing::Test {
 protected:
  void SetUp() override {
    // scripts/install-deps.sh installs openssl: without it the set-up is incomplete.
    ASSERT_EQ(std::system("command -v openssl >/dev/null 2>&1"), 0) << "openssl is not installed";
    dir_ = fs::temp_directory_path() / ("kt-tls-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    const std::string d = dir_.string();
    const std::string script =
        "set -e; cd " + d + "; exec >/dev/null 2>&1\n"
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 1 -subj /CN=kt-ca\n"
        "openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=127.0.0.1\n"
        "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > san.ext\n"
        "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt -days 1 -extfile san.ext\n"
        "openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj /CN=kt-client\n"
        "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out client.crt -days 1\n";
    ASSERT_EQ(std::system(("bash -c '" + script + "'").c_str()), 0) << "certificate generation";
    port_ = free_port();
    const std::string port = std::to_string(port_);
    std::vector<std::string> args = {"openssl", "s_server", "-quiet", "-accept", port,
                                     "-cert", d + "/server.crt", "-key", d + "/server.key",
                                     "-CAfile", d + "/ca.crt", "-Verify", "1", "-www"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
    ASSERT_EQ(posix_spawnp(&server_pid_, "openssl", &actions, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    ASSERT_TRUE(kt::test::eventually([&] { return accepts_connections(port_); }, 10s));
  }

  void TearDown() override {
    if (server_pid_ > 0) {
      ::kill(server_pid_, SIGTERM);
      ::waitpid(server_pid_, nullptr, 0);
    }
    fs::remove_all(dir_);
  }

  HttpClientOptions options() const {
    HttpClientOptions o;
    o.base_url = "https://127.0.0.1:" + std::to_string(port_);
    o.timeout = 10s;
    return o;
  }
  std::string file(const char* name) const { return (dir_ / name).string(); }

  fs::path dir_;
  int port_ = 0;
  pid_t server_pid_ = -1;
};

}  // namespace

TEST_F(TlsServer, CaFileAndClientCertificateFilesConnect) {
  HttpClientOptions o = options();
  o.tls.ca_file = file("ca.crt");
  o.tls.client_cert_file = file("client.crt");
  o.tls.client_key_file = file("client.key");
  HttpClient client(o);
  const HttpResponse r = client.send({.method = "GET", .target = "/"});
  EXPECT_EQ(r.status, 200);
}

TEST_F(TlsServer, PemDataFieldsConnect) {
  HttpClientOptions o = options();
  o.tls.ca_data = slurp(dir_ / "ca.crt");
  o.tls.client_cert_data = slurp(dir_ / "client.crt");
  o.tls.client_key_data = slurp(dir_ / "client.key");
  HttpClient client(o);
  EXPECT_EQ(client.send({.method = "GET", .target = "/"}).status, 200);
}

TEST_F(TlsServer, UnknownCaIsRejectedUnlessVerificationIsSkipped) {
  HttpClientOptions o = options();
  o.tls.client_cert_file = file("client.crt");
  o.tls.client_key_file = file("client.key");
  HttpClient verifying(o);
  EXPECT_THROW(verifying.send({.method = "GET", .target = "/"}), kt::Error)
      << "the server's CA is not trusted";
  o.tls.insecure_skip_verify = true;
  HttpClient insecure(o);
  EXPECT_EQ(insecure.send({.method = "GET", .target = "/"}).status, 200);
}

TEST_F(TlsServer, MissingClientCertificateFailsTheHandshake) {
  HttpClientOptions o = options();
  o.tls.ca_file = file("ca.crt");
  HttpClient client(o);
  EXPECT_THROW(client.send({.method = "GET", .target = "/"}), kt::Error);
}

TEST(HttpClient, MissingTlsFilesFailAtConstructionWithTheirNames) {
  HttpClientOptions o;
  o.base_url = "https://127.0.0.1:1";
  o.tls.ca_file = "/nonexistent/ca.crt";
  try {
    HttpClient client(o);
    ADD_FAILURE() << "no error";
  } catch (const kt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/ca.crt"), std::string::npos) << e.what();
  }
  EXPECT_THROW(HttpClient({.base_url = "ftp://x"}), kt::Error);
}

TEST(HttpClient, ASlowServerHitsTheTimeout) {
  kt::kube::testing::LocalServer local;
  local.server.set_faults({.delay = 3s});
  HttpClient client({.base_url = local.server.url(), .timeout = 300ms});
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(client.send({.method = "GET", .target = "/api/v1/namespaces/default/pods"}),
               kt::Error);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2500ms) << "gave up before the reply";
}

TEST(HttpClient, CancellationAbortsAnInFlightRequest) {
  kt::kube::testing::LocalServer local;
  local.server.set_faults({.delay = 3s});
  HttpClient client({.base_url = local.server.url(), .timeout = 30s});
  CancelToken cancel;
  std::thread canceller([&] {
    std::this_thread::sleep_for(200ms);
    cancel.cancel();
  });
  const auto start = std::chrono::steady_clock::now();
  try {
    client.send({.method = "GET", .target = "/api/v1/namespaces/default/pods"}, &cancel);
    ADD_FAILURE() << "not cancelled";
  } catch (const kt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cancelled"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2500ms);
  canceller.join();
}
