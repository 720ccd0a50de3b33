// The Table responses of `kubectl get`, with the columns a real API server's table printers
// give the built-in kinds (k8s.io/kubernetes pkg/printers/internalversion): pods READY, STATUS,
// RESTARTS, AGE (wide: IP, NODE); nodes STATUS, ROLES, AGE, VERSION; events LAST SEEN, TYPE,
// REASON, OBJECT, MESSAGE; and so on. Kinds without printers get NAME and AGE.
#pragma once

#include <string>
#include <vector>

#include "operator/kube/client.h"

namespace kt::local {

// What each row of a Table carries besides its cells: the API server's `includeObject` query
// parameter. `kubectl get --sort-by` and `-o custom-columns` ask for the whole object.
enum class TableObject { kNone, kMetadata, kObject };

// The `includeObject` parameter's value: "" (the default, Metadata), None, Metadata or Object;
// anything else is a 400 naming the value.
TableObject table_object(const std::string& include_object);

// The Table (meta.k8s.io/v1) that `kubectl get` asks for (Accept: ...;as=Table) of `items`,
// objects of `resource`: one row per item, with the item itself, its metadata as a
// PartialObjectMetadata, or nothing, as `include` says.
// The columns are `printer_columns` (a CRD's additionalPrinterColumns, simple JSONPaths; filters
// are not evaluated) with Name first and Age last, or, when there are none, the built-in
// printer's.
kube::Object table(const kube::Resource& resource, const kube::Object& printer_columns,
                   const std::vector<kube::Object>& items, const std::string& resource_version,
                   TableObject include = TableObject::kMetadata);

}  // namespace kt::local
