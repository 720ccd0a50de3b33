// kubeconfig and in-cluster configuration: fields, current context, relative paths, data
// fields, and errors that name the file and the field.
#include "operator/kube/config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "api/error.h"

namespace fs = std::filesystem;
using kt::kube::Config;
using kt::kube::load_kubeconfig;

namespace {

class KubeconfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kt-kubeconfig-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    const fs::path path = dir_ / name;
    std::ofstream(path) << text;
    return path.string();
  }

  // Expects load_kubeconfig to throw a kt::Error whose message contains every fragment.
  void expect_error(const std::string& path, std::vector<std::string> fragments,
                    const std::string& context = "") {
    try {
      load_kubeconfig(path, context);
      ADD_FAILURE() << "no error for " << path;
    } catch (const kt::Error& e) {
      for (const auto& f : fragments) {
        EXPECT_NE(std::string(e.what()).find(f), std::string::npos)
            << "message \"" << e.what() << "\" lacks \"" << f << "\"";
      }
    }
  }

  fs::path dir_;
};

// "hello" and "key" in base64.
constexpr const char* kTwoContexts = R"(apiVersion: v1
kind: Config
current-context: prod
clusters:
- name: prod-cluster
  cluster:
    server: https://10.0.0.1:6443
    certificate-authority: certs/ca.crt
- name: dev-cluster
  cluster:
    server: https://dev:6443
    certificate-authority-data: aGVsbG8=
    insecure-skip-tls-verify: true
users:
- name: prod-user
  user:
    token: abc.def
- name: dev-user
  user:
    client-certificate-data: aGVsbG8=
    client-key-data: a2V5
contexts:
- name: prod
  context: {cluster: prod-cluster, user: prod-user, namespace: training}
- name: dev
  context: {cluster: dev-cluster, user: dev-user}
)";

}  // namespace

TEST_F(KubeconfigTest, CurrentContextGivesServerTokenNamespaceAndRelativeCaPath) {
  const std::string path = write("config", kTwoContexts);
  const Config c = load_kubeconfig(path);
  EXPECT_EQ(c.server, "https://10.0.0.1:6443");
  EXPECT_EQ(c.token, "abc.def");
  EXPECT_EQ(c.namespace_, "training");
  EXPECT_EQ(c.tls.ca_file, (dir_ / "certs/ca.crt").string()) << "relative to the kubeconfig";
  EXPECT_FALSE(c.tls.insecure_skip_verify);
  EXPECT_NE(c.source.find("context prod"), std::string::npos);
}

TEST_F(KubeconfigTest, NamedContextDecodesDataFieldsAndDefaultsTheNamespace) {
  const std::string path = write("config", kTwoContexts);
  const Config c = load_kubeconfig(path, "dev");
  EXPECT_EQ(c.server, "https://dev:6443");
  EXPECT_EQ(c.tls.ca_data, "hello");
  EXPECT_EQ(c.tls.client_cert_data, "hello");
  EXPECT_EQ(c.tls.client_key_data, "key");
  EXPECT_TRUE(c.tls.insecure_skip_verify);
  EXPECT_EQ(c.token, "");
  EXPECT_EQ(c.namespace_, "default");
}

TEST_F(KubeconfigTest, ClientCertificateFilesAndTokenFile) {
  const std::string path = write("config", R"(current-context: c
clusters: [{name: k, cluster: {server: "https://k:6443"}}]
users: [{name: u, user: {client-certificate: /abs/client.crt, client-key: rel/client.key, tokenFile: tok}}]
contexts: [{name: c, context: {cluster: k, user: u}}]
)");
  const Config c = load_kubeconfig(path);
  EXPECT_EQ(c.tls.client_cert_file, "/abs/client.crt");
  EXPECT_EQ(c.tls.client_key_file, (dir_ / "rel/client.key").string());
  EXPECT_EQ(c.token_file, (dir_ / "tok").string());
}

TEST_F(KubeconfigTest, ErrorsNameTheFileAndTheField) {
  expect_error((dir_ / "absent").string(), {"cannot read kubeconfig", "absent"});
  expect_error(write("no-current", "clusters: []\n"), {"no-current", "current-context: missing"});
  expect_error(write("unknown-context", kTwoContexts), {"unknown-context", "contexts", "\"qa\""},
               "qa");
  expect_error(write("no-server", R"(current-context: c
clusters: [{name: k, cluster: {certificate-authority: ca}}]
contexts: [{name: c, context: {cluster: k}}]
)"),
               {"no-server", "clusters[name=k].cluster.server: missing"});
  expect_error(write("no-cluster", R"(current-context: c
clusters: [{name: other, cluster: {server: "https://x"}}]
contexts: [{name: c, context: {cluster: k}}]
)"),
               {"no-cluster", "clusters: no entry named \"k\""});
  expect_error(write("cert-without-key", R"(current-context: c
clusters: [{name: k, cluster: {server: "https://x"}}]
users: [{name: u, user: {client-certificate-data: aGVsbG8=}}]
contexts: [{name: c, context: {cluster: k, user: u}}]
)"),
               {"cert-without-key", "users[name=u].user.client-key: missing"});
  expect_error(write("bad-base64", R"(current-context: c
clusters: [{name: k, cluster: {server: "https://x", certificate-authority-data: "!!"}}]
contexts: [{name: c, context: {cluster: k}}]
)"),
               {"bad-base64", "certificate-authority-data", "base64"});
  expect_error(write("exec", R"(current-context: c
clusters: [{name: k, cluster: {server: "https://x"}}]
users: [{name: u, user: {exec: {command: aws}}}]
contexts: [{name: c, context: {cluster: k, user: u}}]
)"),
               {"exec", "users[name=u].user.exec: not supported"});
  expect_error(write("garbage", "[1, 2\n"), {"garbage"});
}

// Found by fuzz/kubeconfig_fuzz.cpp: an entry whose name was null (or a number) threw
// nlohmann's type_error instead of naming nothing.
TEST_F(KubeconfigTest, EntryNamedByANonString_NamesNothing) {
  const std::string path = write("config", R"(current-context: a
contexts:
- name: null
- name: 7
- name: a
  context: {cluster: a}
clusters:
- {name: ~, cluster: {server: "https://other"}}
)");
  expect_error(path, {path, "clusters: no entry named \"a\""});
}

TEST_F(KubeconfigTest, InClusterReadsTheServiceAccountFiles) {
  write("token", "t0ken\n");
  write("ca.crt", "-----BEGIN CERTIFICATE-----\n");
  write("namespace", "kubetrain-system\n");
  const Config c = kt::kube::in_cluster_config(
      {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"}, {"KUBERNETES_SERVICE_PORT", "443"}},
      dir_.string());
  EXPECT_EQ(c.server, "https://10.96.0.1:443");
  EXPECT_EQ(c.token_file, (dir_ / "token").string());
  EXPECT_EQ(c.tls.ca_file, (dir_ / "ca.crt").string());
  EXPECT_EQ(c.namespace_, "kubetrain-system");

  const Config v6 = kt::kube::in_cluster_config(
      {{"KUBERNETES_SERVICE_HOST", "fd00::1"}, {"KUBERNETES_SERVICE_PORT", "443"}},
      dir_.string());
  EXPECT_EQ(v6.server, "https://[fd00::1]:443");
}

TEST_F(KubeconfigTest, InClusterErrorsSayWhatIsMissing) {
  EXPECT_THROW(kt::kube::in_cluster_config({}, dir_.string()), kt::Error);
  try {
    kt::kube::in_cluster_config(
        {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"}, {"KUBERNETES_SERVICE_PORT", "443"}},
        dir_.string());
    ADD_FAILURE() << "no error without a token file";
  } catch (const kt::Error& e) {
    EXPECT_NE(std::string(e.what()).find((dir_ / "token").string()), std::string::npos) << e.what();
  }
}

TEST_F(KubeconfigTest, BearerTokenFileIsReReadAfterItsPeriod) {
  const std::string path = write("token", "first\n");
  kt::kube::BearerToken cached("", path, std::chrono::seconds(3600));
  kt::kube::BearerToken fresh("", path, std::chrono::seconds(0));
  EXPECT_EQ(cached.get(), "first");
  EXPECT_EQ(fresh.get(), "first");
  write("token", "second\n");
  EXPECT_EQ(cached.get(), "first") << "within the period the old token is kept";
  EXPECT_EQ(fresh.get(), "second");
  fs::remove(path);
  EXPECT_EQ(fresh.get(), "second") << "a failed re-read keeps the last token";
  EXPECT_EQ(kt::kube::BearerToken("fixed", "").get(), "fixed");
}

TEST(Base64, DecodesWithAndWithoutPaddingAndRejectsGarbage) {
  EXPECT_EQ(kt::kube::base64_decode("aGVsbG8=", "x"), "hello");
  EXPECT_EQ(kt::kube::base64_decode("aGVsbG8", "x"), "hello");
  EXPECT_EQ(kt::kube::base64_decode("aGVs\nbG8h", "x"), "hello!");
  EXPECT_THROW(kt::kube::base64_decode("a$b", "x"), kt::Error);
}
