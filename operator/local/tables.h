// The columns `kubectl get` prints for the built-in kinds, as a real API server's table
// printers give them (k8s.io/kubernetes pkg/printers/internalversion): pods READY, STATUS,
// RESTARTS, AGE (wide: IP, NODE); nodes STATUS, ROLES, AGE, VERSION; events LAST SEEN, TYPE,
// REASON, OBJECT, MESSAGE; and so on. Kinds without printers get NAME and AGE.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "operator/kube/client.h"

namespace kt::local {

struct TableColumn {
  std::string name;         // "Ready"
  std::string type;         // "string", "integer", "number", "date"
  std::string description;
  int priority = 0;         // 1: shown only with -o wide
  std::function<kube::Object(const kube::Object&)> cell;  // the row's value
};

// The columns of `resource`'s built-in printer, Name included; Name and Age for a kind that has
// no printer of its own.
std::vector<TableColumn> builtin_columns(const kube::Resource& resource);

// kubectl's short relative time of a duration (apimachinery duration.HumanDuration).
std::string human_duration(long long seconds);
// Seconds since an RFC 3339 timestamp; -1 when it is not one.
long long seconds_since(const std::string& timestamp);

}  // namespace kt::local
