// The Table responses of `kubectl get`, with the columns a real API server's table printers
// give the built-in kinds (k8s.io/kubernetes pkg/printers/internalversion): pods READY, STATUS,
// RESTARTS, AGE (wide: IP, NODE); nodes STATUS, ROLES, AGE, VERSION; events LAST SEEN, TYPE,
// REASON, OBJECT, MESSAGE; and so on. Kinds without printers get NAME and AGE.
#pragma once

#include <string>
#include <vector>

#include "operator/kube/client.h"

namespace kt::local {

// The Table (meta.k8s.io/v1) that `kubectl get` asks for (Accept: ...;as=Table) of `items`,
// objects of `resource`: one row per item, with the item's metadata as a PartialObjectMetadata.
// The columns are `printer_columns` (a CRD's additionalPrinterColumns, simple JSONPaths; filters
// are not evaluated) with Name first and Age last, or, when there are none, the built-in
// printer's.
kube::Object table(const kube::Resource& resource, const kube::Object& printer_columns,
                   const std::vector<kube::Object>& items, const std::string& resource_version);

}  // namespace kt::local
