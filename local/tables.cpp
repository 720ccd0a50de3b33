// The Table responses of `kubectl get` (tables.h): the built-in kinds' printers and a CRD's
// additionalPrinterColumns.
#include "local/tables.h"

#include <ctime>
#include <functional>

#include "local/builtin_resources.h"

namespace kt::local {
namespace {

using kube::Object;

// One column of a Table and how a row gets its cell.
struct TableColumn {
  std::string name;         // "Ready"
  std::string type;         // "string", "integer", "number", "date"
  std::string description;
  int priority = 0;         // 1: shown only with -o wide
  std::function<kube::Object(const kube::Object&)> cell;  // the row's value
};

// Seconds since an RFC 3339 timestamp; -1 when it is not one.
long long seconds_since(const std::string& timestamp) {
  std::tm tm{};
  if (!strptime(timestamp.c_str(), "%Y-%m-%dT%H:%M:%S", &tm)) return -1;
  const long long s = static_cast<long long>(std::time(nullptr) - timegm(&tm));
  return s < 0 ? 0 : s;
}

// kubectl's short relative time of a duration (apimachinery duration.HumanDuration).
std::string human_duration(long long seconds) {
  if (seconds < 0) seconds = 0;
  if (seconds < 120) return std::to_string(seconds) + "s";
  const long long minutes = seconds / 60;
  if (minutes < 10) {
    const long long s = seconds % 60;
    return std::to_string(minutes) + "m" + (s ? std::to_string(s) + "s" : "");
  }
  if (minutes < 180) return std::to_string(minutes) + "m";
  const long long hours = minutes / 60;
  if (hours < 8) {
    const long long m = minutes % 60;
    return std::to_string(hours) + "h" + (m ? std::to_string(m) + "m" : "");
  }
  if (hours < 48) return std::to_string(hours) + "h";
  if (hours < 24 * 8) {
    const long long h = hours % 24;
    return std::to_string(hours / 24) + "d" + (h ? std::to_string(h) + "h" : "");
  }
  if (hours < 24 * 365 * 2) return std::to_string(hours / 24) + "d";
  return std::to_string(hours / 24 / 365) + "y";
}

Object field(const Object& obj, const char* a, const char* b = nullptr, const char* c = nullptr) {
  const Object* at = &obj;
  for (const char* key : {a, b, c}) {
    if (!key) break;
    if (!at->is_object() || !at->contains(key)) return nullptr;
    at = &(*at)[key];
  }
  return *at;
}

std::string text(const Object& value, const std::string& fallback = "<none>") {
  return value.is_string() && !value.get<std::string>().empty() ? value.get<std::string>()
                                                                 : fallback;
}

Object age_of(const Object& obj, const char* a, const char* b = nullptr) {
  const Object t = field(obj, a, b);
  const long long s = t.is_string() ? seconds_since(t.get<std::string>()) : -1;
  return s < 0 ? Object("<unknown>") : Object(human_duration(s));
}

Object age(const Object& obj) {
  return age_of(obj, "metadata", "creationTimestamp");
}

TableColumn name_column(int priority = 0) {
  return {"Name", "string", "Name must be unique within a namespace.", priority,
          [](const Object& o) { return field(o, "metadata", "name"); }};
}

// Name first, then the kind's own columns.
std::vector<TableColumn> named(std::vector<TableColumn> columns) {
  columns.insert(columns.begin(), name_column());
  return columns;
}

// The pod's STATUS column: the reason of the first container that is not running, else the
// pod's reason, else its phase; Terminating once deletion started (printPod).
std::string pod_status(const Object& pod) {
  std::string reason = text(field(pod, "status", "phase"), "Pending");
  if (auto r = field(pod, "status", "reason"); r.is_string() && !r.get<std::string>().empty())
    reason = r.get<std::string>();
  const Object statuses = field(pod, "status", "containerStatuses");
  if (statuses.is_array()) {
    for (const auto& c : statuses) {
      const Object waiting = field(c, "state", "waiting", "reason");
      const Object terminated = field(c, "state", "terminated");
      if (waiting.is_string() && !waiting.get<std::string>().empty()) {
        reason = waiting.get<std::string>();
      } else if (terminated.is_object()) {
        const std::string why = text(terminated.value("reason", Object()), "");
        if (!why.empty()) reason = why;
        else
          reason = "ExitCode:" + std::to_string(terminated.value("exitCode", 0));
      }
    }
  }
  if (field(pod, "metadata", "deletionTimestamp").is_string()) reason = "Terminating";
  return reason;
}

std::vector<TableColumn> pod_columns() {
  return {
      {"Ready", "string", "The aggregate readiness state of this pod for accepting traffic.", 0,
       [](const Object& pod) {
         const Object containers = field(pod, "spec", "containers");
         const Object statuses = field(pod, "status", "containerStatuses");
         int ready = 0;
         if (statuses.is_array())
           for (const auto& c : statuses) ready += c.value("ready", false) ? 1 : 0;
         return Object(std::to_string(ready) + "/" +
                       std::to_string(containers.is_array() ? containers.size() : 0));
       }},
      {"Status", "string", "The aggregate status of the containers in this pod.", 0,
       [](const Object& pod) { return Object(pod_status(pod)); }},
      {"Restarts", "string", "The number of times the containers in this pod have been restarted.",
       0,
       [](const Object& pod) {
         long long restarts = 0;
         const Object statuses = field(pod, "status", "containerStatuses");
         if (statuses.is_array())
           for (const auto& c : statuses) restarts += c.value("restartCount", 0LL);
         return Object(std::to_string(restarts));
       }},
      {"Age", "string", "CreationTimestamp", 0, age},
      {"IP", "string", "IP address allocated to the pod.", 1,
       [](const Object& pod) { return Object(text(field(pod, "status", "podIP"))); }},
      {"Node", "string", "Name of the Node where the Pod is scheduled.", 1,
       [](const Object& pod) { return Object(text(field(pod, "spec", "nodeName"))); }},
  };
}

std::vector<TableColumn> node_columns() {
  return {
      {"Status", "string", "The status of the node", 0,
       [](const Object& node) {
         std::string status = "Unknown";
         const Object conditions = field(node, "status", "conditions");
         if (conditions.is_array())
           for (const auto& c : conditions)
             if (c.value("type", "") == "Ready")
               status = c.value("status", "") == "True" ? "Ready" : "NotReady";
         if (field(node, "spec", "unschedulable") == Object(true)) status += ",SchedulingDisabled";
         return Object(status);
       }},
      {"Roles", "string", "The roles of the node", 0,
       [](const Object& node) {
         std::string roles;
         const Object labels = field(node, "metadata", "labels");
         const std::string prefix = "node-role.kubernetes.io/";
         if (labels.is_object())
           for (const auto& [key, _] : labels.items())
             if (key.rfind(prefix, 0) == 0 && key.size() > prefix.size())
               roles += (roles.empty() ? "" : ",") + key.substr(prefix.size());
         return Object(roles.empty() ? "<none>" : roles);
       }},
      {"Age", "string", "CreationTimestamp", 0, age},
      {"Version", "string", "Kubelet Version reported by the node.", 0,
       [](const Object& node) {
         return Object(text(field(node, "status", "nodeInfo", "kubeletVersion"), ""));
       }},
      {"Internal-IP", "string", "List of internal IPs for the node.", 1,
       [](const Object& node) {
         const Object addresses = field(node, "status", "addresses");
         if (addresses.is_array())
           for (const auto& a : addresses)
             if (a.value("type", "") == "InternalIP") return Object(a.value("address", ""));
         return Object("<none>");
       }},
  };
}

std::vector<TableColumn> event_columns() {
  return {
      {"Last Seen", "string", "Time when last this event was observed", 0,
       [](const Object& e) {
         for (const char* key : {"lastTimestamp", "eventTime", "firstTimestamp"}) {
           const Object t = field(e, key);
           if (t.is_string() && seconds_since(t.get<std::string>()) >= 0)
             return Object(human_duration(seconds_since(t.get<std::string>())));
         }
         return age(e);
       }},
      {"Type", "string", "Type of this event (Normal, Warning)", 0,
       [](const Object& e) { return Object(text(field(e, "type"), "")); }},
      {"Reason", "string", "Why the action was taken", 0,
       [](const Object& e) { return Object(text(field(e, "reason"), "")); }},
      {"Object", "string", "The object this event is about", 0,
       [](const Object& e) {
         std::string kind = text(field(e, "involvedObject", "kind"), "");
         for (char& c : kind) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
         return Object(kind + "/" + text(field(e, "involvedObject", "name"), ""));
       }},
      {"Message", "string", "A human-readable description of the status of this operation", 0,
       [](const Object& e) { return Object(text(field(e, "message"), "")); }},
  };
}

std::vector<TableColumn> service_columns() {
  return {
      {"Type", "string", "The type of the service", 0,
       [](const Object& s) { return Object(text(field(s, "spec", "type"), "ClusterIP")); }},
      {"Cluster-IP", "string", "The cluster IP of the service", 0,
       [](const Object& s) { return Object(text(field(s, "spec", "clusterIP"))); }},
      {"External-IP", "string", "The external IPs of the service", 0,
       [](const Object&) { return Object("<none>"); }},
      {"Port(s)", "string", "The ports of the service", 0,
       [](const Object& s) {
         std::string ports;
         const Object list = field(s, "spec", "ports");
         if (list.is_array())
           for (const auto& p : list)
             ports += (ports.empty() ? "" : ",") + std::to_string(p.value("port", 0)) + "/" +
                      p.value("protocol", "TCP");
         return Object(ports.empty() ? "<none>" : ports);
       }},
      {"Age", "string", "CreationTimestamp", 0, age},
  };
}

Object count_of(const Object& obj, const char* key) {
  const Object v = field(obj, key);
  return Object(static_cast<long long>(v.is_object() || v.is_array() ? v.size() : 0));
}

std::vector<TableColumn> deployment_columns() {
  return {
      {"Ready", "string", "Number of the pod with ready state", 0,
       [](const Object& d) {
         const Object ready = field(d, "status", "readyReplicas");
         const Object want = field(d, "spec", "replicas");
         return Object(std::to_string(ready.is_number() ? ready.get<long long>() : 0) + "/" +
                       std::to_string(want.is_number() ? want.get<long long>() : 1));
       }},
      {"Up-to-date", "integer", "Total number of non-terminated pods targeted by this deployment that have the desired template spec.", 0,
       [](const Object& d) {
         const Object v = field(d, "status", "updatedReplicas");
         return Object(v.is_number() ? v.get<long long>() : 0);
       }},
      {"Available", "integer", "Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.", 0,
       [](const Object& d) {
         const Object v = field(d, "status", "availableReplicas");
         return Object(v.is_number() ? v.get<long long>() : 0);
       }},
      {"Age", "string", "CreationTimestamp", 0, age},
  };
}

std::vector<TableColumn> created_at_columns() {
  return {{"Created At", "date", "CreationTimestamp", 0, [](const Object& o) {
             return field(o, "metadata", "creationTimestamp");
           }}};
}

// The columns of `r`'s built-in printer, Name included; Name and Age for a kind that has no
// printer of its own.
std::vector<TableColumn> builtin_columns(const kube::Resource& r) {
  if (r == kube::kPods) return named(pod_columns());
  if (r == kube::kNodes) return named(node_columns());
  if (r == kube::kEvents) {
    // kubectl get events: no leading Name (it is a wide column at the end), no Age.
    auto columns = event_columns();
    columns.push_back(name_column(1));
    return columns;
  }
  if (r == kube::kServices) return named(service_columns());
  if (r == kDeployments) return named(deployment_columns());
  if (r == kube::kCustomResourceDefinitions || r == kClusterRoles || r == kRoles)
    return named(created_at_columns());
  if (r == kNamespaces)
    return named({{"Status", "string", "The status of the namespace", 0,
             [](const Object& n) { return Object(text(field(n, "status", "phase"), "Active")); }},
            {"Age", "string", "CreationTimestamp", 0, age}});
  if (r == kube::kConfigMaps)
    return named({{"Data", "integer", "Number of data entries", 0,
             [](const Object& c) {
               return Object(count_of(c, "data").get<long long>() +
                             count_of(c, "binaryData").get<long long>());
             }},
            {"Age", "string", "CreationTimestamp", 0, age}});
  if (r == kSecrets)
    return named({{"Type", "string", "The type of the secret", 0,
             [](const Object& s) { return Object(text(field(s, "type"), "Opaque")); }},
            {"Data", "integer", "Number of data entries", 0,
             [](const Object& s) { return count_of(s, "data"); }},
            {"Age", "string", "CreationTimestamp", 0, age}});
  if (r == kServiceAccounts)
    return named({{"Secrets", "integer", "Number of secrets", 0,
             [](const Object& s) { return count_of(s, "secrets"); }},
            {"Age", "string", "CreationTimestamp", 0, age}});
  if (r == kPodDisruptionBudgets) {
    auto spec_value = [](const char* key) {
      return [key](const Object& p) {
        const Object v = field(p, "spec", key);
        return Object(v.is_number() ? v.dump() : text(v, "N/A"));
      };
    };
    return named({{"Min Available", "string", "The minimum number of pods that must be available", 0,
                   spec_value("minAvailable")},
                  {"Max Unavailable", "string", "The maximum number of pods that may be unavailable", 0,
                   spec_value("maxUnavailable")},
                  {"Allowed Disruptions", "integer", "Calculated number of pods that may be disrupted at this time", 0,
                   [](const Object& p) {
                     const Object v = field(p, "status", "disruptionsAllowed");
                     return Object(v.is_number() ? v.get<long long>() : 0);
                   }},
                  {"Age", "string", "CreationTimestamp", 0, age}});
  }
  if (r == kube::kLeases)
    return named({{"Holder", "string", "The holder of the lease", 0,
             [](const Object& l) { return Object(text(field(l, "spec", "holderIdentity"), "")); }},
            {"Age", "string", "CreationTimestamp", 0, age}});
  if (r == kRoleBindings || r == kClusterRoleBindings)
    return named({{"Role", "string", "The role of the binding", 0,
             [](const Object& b) {
               return Object(text(field(b, "roleRef", "kind"), "") + "/" +
                             text(field(b, "roleRef", "name"), ""));
             }},
            {"Age", "string", "CreationTimestamp", 0, age}});
  return named({{"Age", "string", "CreationTimestamp", 0, age}});
}

// A printer column's value: simple JSONPath (".status.phase", ".spec.items[0].name").
Object json_path(const Object& object, const std::string& path) {
  const Object* at = &object;
  std::size_t i = 0;
  while (i < path.size()) {
    if (path[i] == '.') {
      ++i;
      continue;
    }
    if (path[i] == '[') {
      const auto close = path.find(']', i);
      if (close == std::string::npos) return nullptr;
      try {
        const std::size_t index = std::stoul(path.substr(i + 1, close - i - 1));
        if (!at->is_array() || index >= at->size()) return nullptr;
        at = &(*at)[index];
      } catch (const std::exception&) {
        return nullptr;  // filters ([?(@.type=="Ready")]) are not supported
      }
      i = close + 1;
      continue;
    }
    auto end = path.find_first_of(".[", i);
    if (end == std::string::npos) end = path.size();
    const std::string key = path.substr(i, end - i);
    if (!at->is_object() || !at->contains(key)) return nullptr;
    at = &(*at)[key];
    i = end;
  }
  return *at;
}

}  // namespace

TableObject table_object(const std::string& include_object) {
  if (include_object.empty() || include_object == "Metadata") return TableObject::kMetadata;
  if (include_object == "None") return TableObject::kNone;
  if (include_object == "Object") return TableObject::kObject;
  throw kube::ApiError(400, "BadRequest",
                       "includeObject: Unsupported value: \"" + include_object +
                           "\": supported values: \"None\", \"Metadata\", \"Object\"");
}

Object table(const kube::Resource& resource, const Object& printer_columns,
             const std::vector<Object>& items, const std::string& resource_version,
             TableObject include) {
  // The columns: a CRD's additionalPrinterColumns, a built-in kind's printer, else Age.
  std::vector<TableColumn> printer;
  for (const Object& c : printer_columns) {
    const std::string type = c.value("type", "string");
    const std::string path = c.value("jsonPath", "");
    printer.push_back({c.value("name", ""), type, c.value("description", ""),
                       c.value("priority", 0), [type, path](const Object& item) {
                         Object value = json_path(item, path);
                         if (type == "date" && value.is_string()) {
                           const long long age = seconds_since(value.get<std::string>());
                           value = age >= 0 ? Object(human_duration(age)) : Object(nullptr);
                         }
                         return value;
                       }});
  }
  if (printer_columns.empty()) {
    printer = builtin_columns(resource);
  } else {
    bool has_age = false;
    for (const TableColumn& c : printer) has_age = has_age || c.name == "Age";
    if (!has_age) printer.push_back({"Age", "date", "CreationTimestamp", 0, age});
    printer = named(std::move(printer));
  }
  Object columns = Object::array();
  for (const TableColumn& c : printer) {
    columns.push_back({{"name", c.name}, {"type", c.type},
                       {"format", c.name == "Name" ? "name" : ""},
                       {"description", c.description}, {"priority", c.priority}});
  }
  Object rows = Object::array();
  for (const Object& item : items) {
    Object cells = Object::array();
    const Object meta = item.value("metadata", Object::object());
    for (const TableColumn& c : printer) cells.push_back(c.cell(item));
    Object row = {{"cells", cells}};
    if (include == TableObject::kObject) {
      row["object"] = item;
    } else if (include == TableObject::kMetadata) {
      row["object"] = {{"kind", "PartialObjectMetadata"},
                       {"apiVersion", "meta.k8s.io/v1"},
                       {"metadata", meta}};
    }
    rows.push_back(std::move(row));
  }
  return {{"kind", "Table"},
          {"apiVersion", "meta.k8s.io/v1"},
          {"metadata", {{"resourceVersion", resource_version}}},
          {"columnDefinitions", columns},
          {"rows", rows}};
}

}  // namespace kt::local
