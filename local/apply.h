// Server-side apply and field ownership as the API server does them (structured-merge-diff with
// the apiserver's field manager, k8s.io/apimachinery/pkg/util/managedfields), on JSON objects, so
// that `kubectl apply --server-side` and Helm 4 (PATCH, Content-Type application/apply-patch+yaml,
// ?fieldManager=NAME[&force=true]) cannot tell the local control plane from a cluster.
//
// A pure library: no store, no HTTP. The caller (the Store or the HTTP front end) reads the live
// object, calls apply() or record_update(), and writes what comes back.
//
// What a type is comes from a CRD version's openAPIV3Schema when one is given
// (x-kubernetes-list-type map/set/atomic with x-kubernetes-list-map-keys and their defaults,
// x-kubernetes-map-type atomic, additionalProperties, x-kubernetes-preserve-unknown-fields), and
// otherwise from a small built-in table of what Kubernetes' own schemas say:
//   * list maps: containers, initContainers, ephemeralContainers (by name) of a pod spec at
//     spec, spec.template.spec, spec.jobTemplate.spec.template.spec and template.spec; their env
//     (name), ports (containerPort, protocol defaulting to "TCP"), volumeMounts (mountPath),
//     volumeDevices (devicePath); the pod spec's volumes, imagePullSecrets, resourceClaims,
//     schedulingGates (name), hostAliases (ip), topologySpreadConstraints (topologyKey,
//     whenUnsatisfiable); a Service's spec.ports (port, protocol defaulting to "TCP");
//     metadata.ownerReferences (uid); status.conditions (type);
//   * sets: metadata.finalizers;
//   * atomic structs: spec.selector (a LabelSelector) of Deployment, ReplicaSet, StatefulSet,
//     DaemonSet, Job and PodDisruptionBudget, CronJob's spec.jobTemplate.spec.selector,
//     NetworkPolicy's spec.podSelector;
//   * every other list is atomic, every other object is granular (labels, annotations, data, ...
//     per key). metadata always follows ObjectMeta's rules, also for custom resources.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "operator/kube/client.h"

namespace kt::local {

// The endpoint a write goes to, as its URL and the served resource say.
struct WriteTarget {
  kube::Resource resource;  // resource.api_version() is the apiVersion of the managedFields entry
  std::string ns;           // "" for a cluster-scoped resource
  std::string name;
  std::string subresource;  // "" or "status", "scale": recorded in the entry's `subresource`
  // A CRD version's openAPIV3Schema (find_version_schema in schema.h); null: the built-in table.
  const nlohmann::json* schema = nullptr;
  // Dotted paths this endpoint resets whatever a writer sends (the registry strategies'
  // GetResetFields): {"status"} on the main resource of a kind with a status subresource,
  // {"spec"} (and e.g. "metadata.labels") on its /status. A writer neither sets nor owns them.
  std::vector<std::string> reset_fields;
};

// One field another manager owns with a different value than the applied one.
struct ApplyConflict {
  std::string manager;  // "helm"; as the API server prints it: `"helm"`, `"kubectl" using v1`
  std::string manager_description;
  std::string field;  // ".spec.template.spec.containers[name=\"app\"].image"
};

struct ApplyResult {
  // The object to store (managedFields included); when `conflicts` is non-empty, nothing was
  // applied and `object` is null.
  kube::Object object;
  std::vector<ApplyConflict> conflicts;
  // Whether `object` differs from the live one other than in metadata.managedFields (the API
  // server stamps the applier's entry with `now` only then). false on a no-op apply, which may
  // still change managedFields (e.g. a new co-owner).
  bool changed = false;
  bool created = false;  // the live object was null
};

// Checks ?fieldManager= as the API server does for apply (ValidatePatchOptions): empty is
// ApiError 422 Invalid `PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is
// required for apply patch`; longer than 128 bytes is 422 as well.
void check_apply_field_manager(const std::string& manager);

// The body of an apply patch (YAML or JSON) as an object; ApiError 400 "error decoding YAML: ..."
// when it is not one.
kube::Object parse_apply_body(const std::string& body);

// Server-side apply of `applied` by `manager` onto `live` (null: the object does not exist, the
// apply creates it). Throws ApiError for what the API server refuses before merging:
//   * 422 a missing or too long fieldManager (check_apply_field_manager);
//   * 400 `invalid object type: apps/v1, Kind=Deployment` when apiVersion/kind are not the
//     resource's; 400 `metadata.managedFields must be nil`;
//   * 500 `failed to create typed patch object (ns/name; apps/v1, Kind=Deployment): ...` for a
//     list map item without any key field, or duplicate keys (`duplicate entries for key
//     [name="app"]`), as structured-merge-diff reports them;
//   * 400 `the name of the object (x) does not match the name on the URL (y)` and the namespace's
//     counterpart;
// and returns conflicts (not thrown; see conflict_error) unless `force`. What it does
// (merge.Updater.Apply):
//   1. a live object without managedFields first gets an Update entry "before-first-apply" owning
//      all its fields (skipnonapplied.go), so that an apply conflicts with what was there;
//   2. the applied config is merged into the live object: fields it has are set; granular
//      objects merge per key, list maps per key (keeping live-only items where they were),
//      sets as unions, atomic lists and objects are replaced; a null removes the field;
//   3. fields the manager's previous Apply entry owned that this config lacks are removed from the
//      object, unless another manager (Apply or Update) owns them or something inside them;
//   4. every other manager owning a field whose value the apply changes (or adds) is a conflict;
//      with force the field moves to this manager. Equal values become co-owned;
//   5. the manager's Apply entry becomes the config's fields, less the ones the server owns
//      (apiVersion, kind, metadata.name/namespace/uid/resourceVersion/generation/
//      creationTimestamp/managedFields/selfLink); its time is `now` when the object changed.
ApplyResult apply(const kube::Object& live, const kube::Object& applied, const WriteTarget& target,
                  const std::string& manager, bool force,
                  std::chrono::system_clock::time_point now);

// Records a non-apply write (create, PUT, merge or JSON patch) of `updated` over `live` (null on
// create) by `manager` in updated's metadata.managedFields, as the API server's Update operation
// does (merge.Updater.Update): the manager's "Update" entry for this apiVersion and subresource
// gains every field the write added or changed, those fields leave every other manager (Apply
// entries included), removed fields leave everyone. Like the API server: a request body's own
// non-empty managedFields replace the live ones (not on a subresource), `[]` or `[{}]` resets
// them, and an existing object that has no managedFields stays untracked until its first apply.
kube::Object record_update(const kube::Object& live, kube::Object updated,
                           const WriteTarget& target, const std::string& manager,
                           std::chrono::system_clock::time_point now);

// The manager the API server names a write without ?fieldManager= after: the User-Agent up to
// its first "/" ("kubectl-client-side-apply/v1.31.0 (linux/amd64) ..." -> "kubectl-client-side-
// apply"), printable characters only, at most 128 bytes.
std::string manager_from_user_agent(const std::string& user_agent);

// The API server's apply conflict (409, reason "Conflict"), message as
// `Apply failed with 1 conflict: conflict with "helm" using apps/v1: .spec.replicas` or
// `Apply failed with 2 conflicts: conflicts with "helm":\n- .spec.replicas\n- .spec.paused`.
std::string conflict_message(const std::vector<ApplyConflict>& conflicts);
kube::ApiError conflict_error(const std::vector<ApplyConflict>& conflicts);
// The whole metav1.Status, with details.causes [{reason: FieldManagerConflict, message:
// `conflict with "helm"`, field: ".spec.replicas"}, ...].
kube::Object conflict_status(const std::vector<ApplyConflict>& conflicts);

}  // namespace kt::local
