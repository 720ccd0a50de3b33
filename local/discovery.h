// Discovery as kube-apiserver serves it, what kubectl and client-go read before any request:
// the resources this server serves (the built-ins, those added without a CRD, every CRD's
// storage version) and the documents of /version, /api, /apis and /api/v1,
// /apis/<group>/<version>. The OpenAPI documents are openapi.h's.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "operator/kube/client.h"

namespace kt::local {

// The Kubernetes release whose API this server follows: what /version and /openapi/v2 report.
inline constexpr const char* kKubeMajor = "1";
inline constexpr const char* kKubeMinor = "32";

// A resource as discovery describes it.
struct ServedResource {
  kube::Resource resource;
  std::string singular;
  std::vector<std::string> short_names;
  std::vector<std::string> categories;
  bool status = false;                                   // has the status subresource
  kube::Object printer_columns = kube::Object::array();  // CRD additionalPrinterColumns
};

// The built-in resources (builtin_resources.h).
std::vector<ServedResource> builtin_served();
// The resource a stored CRD defines (its storage version, as the Store serves it); nullopt when
// the CRD names no group, plural or version.
std::optional<ServedResource> served_from_crd(const kube::Object& crd);
// A resource served without a CRD object (ApiServer::add_resource); its singular is the
// lower-cased kind.
ServedResource served_without_crd(const kube::Resource& resource, bool status_subresource,
                                  std::vector<std::string> short_names);

// GET /version.
kube::Object version_info();
// GET /api: the core group's versions, reached at 127.0.0.1:`port`.
kube::Object api_versions(int port);
// GET /apis: every group of `served` with its versions (APIGroupList).
kube::Object api_group_list(const std::vector<ServedResource>& served);
// GET /api/v1 or /apis/<group>/<version> (APIResourceList, status subresources included);
// nullopt when nothing of `served` is in that group-version.
std::optional<kube::Object> api_resource_list(const std::vector<ServedResource>& served,
                                              const std::string& group, const std::string& version);

}  // namespace kt::local
