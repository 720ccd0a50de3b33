// The OpenAPI documents. v3, what `kubectl explain` reads (GET /openapi/v3, then one document
// per group-version), built from the CRDs' structural schemas as kube-apiserver publishes them:
// one component schema per kind, named by the reversed group ("dev.kubetrain.v1alpha1.
// TrainingJob"), tagged with x-kubernetes-group-version-kind. v2, what kubectl's client-side
// validation reads: a valid document without schemas.
#pragma once

#include <string>
#include <vector>

#include "operator/kube/client.h"

namespace kt::local {

// {"paths": {"apis/<group>/<version>": {"serverRelativeURL": "/openapi/v3/apis/...?hash=..."}}}
// for every served version of the given CRDs.
kube::Object openapi_v3_index(const std::vector<kube::Object>& crds);

// The document of one group-version ("apis/kubetrain.dev/v1alpha1"); nullopt-like null when no
// CRD serves it.
kube::Object openapi_v3_document(const std::vector<kube::Object>& crds, const std::string& group,
                                 const std::string& version);

// GET /openapi/v2: a valid, nearly empty Swagger 2.0 document. kubectl's client-side validation
// finds no schema for a kind and accepts it (the Store validates what it stores).
kube::Object openapi_v2_document();

}  // namespace kt::local
