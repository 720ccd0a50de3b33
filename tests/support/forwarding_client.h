// A kube::Client that passes every call to another: test doubles derive from it and override
// only the calls they count, hold back or fail.
#pragma once

#include <memory>
#include <string>

#include "operator/kube/client.h"

namespace kt::test {

class ForwardingClient : public kube::Client {
 public:
  explicit ForwardingClient(kube::Client& inner) : inner_(inner) {}

  kube::Object get(const kube::Resource& r, const std::string& ns,
                   const std::string& name) override {
    return inner_.get(r, ns, name);
  }
  kube::ObjectList list(const kube::Resource& r, const std::string& ns,
                        const kube::ListOptions& opts) override {
    return inner_.list(r, ns, opts);
  }
  kube::Object create(const kube::Resource& r, const std::string& ns,
                      const kube::Object& obj) override {
    return inner_.create(r, ns, obj);
  }
  kube::Object update(const kube::Resource& r, const std::string& ns,
                      const kube::Object& obj) override {
    return inner_.update(r, ns, obj);
  }
  kube::Object update_status(const kube::Resource& r, const std::string& ns,
                             const kube::Object& obj) override {
    return inner_.update_status(r, ns, obj);
  }
  kube::Object merge_patch(const kube::Resource& r, const std::string& ns, const std::string& name,
                           const kube::Object& patch, bool status_subresource) override {
    return inner_.merge_patch(r, ns, name, patch, status_subresource);
  }
  void remove(const kube::Resource& r, const std::string& ns, const std::string& name,
              kube::Propagation propagation) override {
    inner_.remove(r, ns, name, propagation);
  }
  std::unique_ptr<kube::Watch> watch(const kube::Resource& r, const std::string& ns,
                                     const kube::WatchOptions& opts) override {
    return inner_.watch(r, ns, opts);
  }

 protected:
  kube::Client& inner_;
};

}  // namespace kt::test
