// Structural schemas for the built-in kinds the local control plane stores, in the dialect of a
// CRD's openAPIV3Schema (schema.h applies them), so that a body of the wrong shape is refused at
// the door as kube-apiserver's typed decoding refuses it ("containers" as a map is a 400), and
// the pod runner, the controllers and the authorizer never meet one.
//
// They cover the fields that this control plane reads (the pod runner's containers, volumes and
// ports; the workload controllers' templates and replicas; RBAC rules and bindings; Services,
// ConfigMaps, Secrets, PVCs, Leases and Node allocatables) with their types, and the rules that
// keep a pod on its node's disk: volume names are DNS labels, configMap item paths relative
// without "..", claim names DNS subdomains (as the API server's validation requires). Every object
// level keeps unknown fields (x-kubernetes-preserve-unknown-fields), so nothing a client sends is
// pruned: these schemas type what is there, they do not define the whole of core/v1.
#pragma once

#include <nlohmann/json.hpp>

#include "operator/kube/client.h"

namespace kt::local {

// The schema of a built-in kind; nullptr for kinds left untyped (Namespace, Event, ...).
const nlohmann::json* builtin_schema(const kube::Resource& resource);

}  // namespace kt::local
