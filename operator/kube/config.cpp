#include "operator/kube/config.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "api/error.h"
#include "api/yaml_json.h"

namespace kt::kube {
namespace {

using Json = nlohmann::json;

std::string trim(const std::string& text) {
  const auto begin = text.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  const auto end = text.find_last_not_of(" \t\r\n");
  return text.substr(begin, end - begin + 1);
}

// Reads a file, or throws kt::Error("cannot read WHAT PATH").
std::string read_text(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + what + " " + path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A kubeconfig being read: the file name goes into every message.
class Kubeconfig {
 public:
  Kubeconfig(std::string path, const std::string& text) : path_(std::move(path)) {
    doc_ = api::yaml_to_json(text, path_);
    if (!doc_.is_object()) throw Error(path_ + ": not a kubeconfig (expected a mapping)");
    dir_ = std::filesystem::path(path_).parent_path();
  }

  // The entry `name` of the named list `list` ("clusters"), its `field` ("cluster").
  const Json& entry(const std::string& list, const std::string& name,
                    const std::string& field) const {
    const Json* items = doc_.contains(list) ? &doc_[list] : nullptr;
    if (items && items->is_array()) {
      for (const Json& item : *items) {
        // A name that is not a string (null, a number) names nothing.
        if (item.is_object() && item.contains("name") && item["name"] == name) {
          if (!item.contains(field) || !item[field].is_object()) {
            throw Error(path_ + ": " + list + "[name=" + name + "]." + field + ": missing");
          }
          return item[field];
        }
      }
    }
    throw Error(path_ + ": " + list + ": no entry named \"" + name + "\"");
  }

  std::string string_field(const Json& object, const std::string& field,
                           const std::string& where) const {
    if (!object.contains(field) || object[field].is_null()) return "";
    if (!object[field].is_string()) throw Error(path_ + ": " + where + "." + field + ": not a string");
    return object[field].get<std::string>();
  }

  // A path field, resolved against the kubeconfig's directory.
  std::string path_field(const Json& object, const std::string& field,
                         const std::string& where) const {
    std::string value = string_field(object, field, where);
    if (value.empty() || std::filesystem::path(value).is_absolute()) return value;
    return (dir_ / value).string();
  }

  std::string data_field(const Json& object, const std::string& field,
                         const std::string& where) const {
    const std::string value = string_field(object, field, where);
    if (value.empty()) return "";
    return base64_decode(value, path_ + ": " + where + "." + field);
  }

  const Json& doc() const { return doc_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::filesystem::path dir_;
  Json doc_;
};

}  // namespace

std::string base64_decode(const std::string& text, const std::string& what) {
  auto value_of = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  std::string out;
  unsigned bits = 0;
  int bit_count = 0;
  bool padding = false;
  for (char c : text) {
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    if (c == '=') {
      padding = true;
      continue;
    }
    const int value = value_of(c);
    if (value < 0 || padding) throw Error(what + ": not valid base64");
    bits = (bits << 6) | static_cast<unsigned>(value);
    bit_count += 6;
    if (bit_count >= 8) {
      bit_count -= 8;
      out.push_back(static_cast<char>((bits >> bit_count) & 0xFF));
    }
  }
  if (bit_count >= 6) throw Error(what + ": not valid base64 (truncated)");
  return out;
}

Config load_kubeconfig(const std::string& path, const std::string& context_name) {
  return parse_kubeconfig(read_text(path, "kubeconfig"), path, context_name);
}

Config parse_kubeconfig(const std::string& text, const std::string& path,
                        const std::string& context_name) {
  const Kubeconfig file(path, text);
  const Json& doc = file.doc();
  std::string name = context_name;
  if (name.empty()) name = file.string_field(doc, "current-context", "");
  if (name.empty()) throw Error(path + ": current-context: missing (and no context was given)");

  const Json& context = file.entry("contexts", name, "context");
  const std::string at_context = "contexts[name=" + name + "].context";
  const std::string cluster_name = file.string_field(context, "cluster", at_context);
  if (cluster_name.empty()) throw Error(path + ": " + at_context + ".cluster: missing");
  const std::string user_name = file.string_field(context, "user", at_context);

  Config config;
  config.source = "kubeconfig " + path + ", context " + name;
  config.namespace_ = file.string_field(context, "namespace", at_context);
  if (config.namespace_.empty()) config.namespace_ = "default";

  const Json& cluster = file.entry("clusters", cluster_name, "cluster");
  const std::string at_cluster = "clusters[name=" + cluster_name + "].cluster";
  config.server = file.string_field(cluster, "server", at_cluster);
  if (config.server.empty()) throw Error(path + ": " + at_cluster + ".server: missing");
  config.tls.ca_file = file.path_field(cluster, "certificate-authority", at_cluster);
  config.tls.ca_data = file.data_field(cluster, "certificate-authority-data", at_cluster);
  if (cluster.contains("insecure-skip-tls-verify")) {
    const Json& insecure = cluster["insecure-skip-tls-verify"];
    if (!insecure.is_boolean()) {
      throw Error(path + ": " + at_cluster + ".insecure-skip-tls-verify: not a boolean");
    }
    config.tls.insecure_skip_verify = insecure.get<bool>();
  }

  if (!user_name.empty()) {
    const Json& user = file.entry("users", user_name, "user");
    const std::string at_user = "users[name=" + user_name + "].user";
    for (const char* unsupported : {"exec", "auth-provider", "username", "password"}) {
      if (user.contains(unsupported)) {
        throw Error(path + ": " + at_user + "." + unsupported +
                    ": not supported by kubetrain (use a token or a client certificate)");
      }
    }
    config.token = file.string_field(user, "token", at_user);
    config.token_file = file.path_field(user, "tokenFile", at_user);
    config.tls.client_cert_file = file.path_field(user, "client-certificate", at_user);
    config.tls.client_cert_data = file.data_field(user, "client-certificate-data", at_user);
    config.tls.client_key_file = file.path_field(user, "client-key", at_user);
    config.tls.client_key_data = file.data_field(user, "client-key-data", at_user);
    const bool has_cert = !config.tls.client_cert_file.empty() ||
                          !config.tls.client_cert_data.empty();
    const bool has_key = !config.tls.client_key_file.empty() ||
                         !config.tls.client_key_data.empty();
    if (has_cert && !has_key) {
      throw Error(path + ": " + at_user + ".client-key: missing (client-certificate is set)");
    }
    if (has_key && !has_cert) {
      throw Error(path + ": " + at_user + ".client-certificate: missing (client-key is set)");
    }
  }
  return config;
}

Config in_cluster_config(const std::map<std::string, std::string>& env,
                         const std::string& secrets_dir) {
  auto lookup = [&](const std::string& name) {
    auto it = env.find(name);
    return it == env.end() ? std::string() : it->second;
  };
  const std::string host = lookup("KUBERNETES_SERVICE_HOST");
  const std::string port = lookup("KUBERNETES_SERVICE_PORT");
  if (host.empty() || port.empty()) {
    throw Error("not running in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT "
                "must be set");
  }
  Config config;
  // An IPv6 service address needs brackets in a URL.
  config.server = "https://" + (host.find(':') != std::string::npos ? "[" + host + "]" : host) +
                  ":" + port;
  config.token_file = secrets_dir + "/token";
  config.tls.ca_file = secrets_dir + "/ca.crt";
  read_text(config.token_file, "service account token file");  // fail now, with the name
  read_text(config.tls.ca_file, "service account CA file");
  const std::string ns_file = secrets_dir + "/namespace";
  config.namespace_ = std::filesystem::exists(ns_file) ? trim(read_text(ns_file, "namespace file"))
                                                       : "default";
  config.source = "in-cluster service account " + secrets_dir;
  return config;
}

Config load_config(const std::string& kubeconfig_flag) {
  if (!kubeconfig_flag.empty()) return load_kubeconfig(kubeconfig_flag);
  if (const char* list = std::getenv("KUBECONFIG"); list && *list) {
    std::stringstream paths(list);
    std::string path;
    while (std::getline(paths, path, ':')) {
      if (!path.empty() && std::filesystem::exists(path)) return load_kubeconfig(path);
    }
    throw Error(std::string("KUBECONFIG=") + list + ": no such file");
  }
  if (const char* host = std::getenv("KUBERNETES_SERVICE_HOST"); host && *host) {
    const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
    return in_cluster_config(
        {{"KUBERNETES_SERVICE_HOST", host}, {"KUBERNETES_SERVICE_PORT", port ? port : ""}});
  }
  const char* home = std::getenv("HOME");
  const std::string path = std::string(home ? home : "") + "/.kube/config";
  if (!std::filesystem::exists(path)) {
    throw Error("no Kubernetes configuration: no --kubeconfig, no $KUBECONFIG, not in a cluster, "
                "and no " + path);
  }
  return load_kubeconfig(path);
}

BearerToken::BearerToken(std::string token, std::string file, std::chrono::seconds reread_after)
    : file_(std::move(file)), reread_after_(reread_after), token_(std::move(token)) {}

std::string BearerToken::get() {
  std::lock_guard lock(mutex_);
  if (file_.empty()) return token_;
  const auto now = std::chrono::steady_clock::now();
  if (!ever_read_ || now - read_at_ >= reread_after_) {
    try {
      token_ = trim(read_text(file_, "token file"));
      ever_read_ = true;
      read_at_ = now;
    } catch (const Error&) {
      if (!ever_read_) throw;
      read_at_ = now;  // keep the last token; try again after the period
    }
  }
  return token_;
}

}  // namespace kt::kube
