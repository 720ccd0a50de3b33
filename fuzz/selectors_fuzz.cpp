// libFuzzer harness: label and field selectors (operator/kube/selectors.h), as `kubetrain local
// serve` reads them from ?labelSelector= and ?fieldSelector= of any client. Input: the
// selector, a NUL, then the object (JSON; an empty object when it does not parse). A selector
// must match, not match, or be refused with ApiError 400, and whether it is refused must not
// depend on the object; "k=v" and "k!=v" must disagree on every object.
//   fuzz/run.sh selectors 60
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "api/error.h"
#include "api/yaml_json.h"
#include "fuzz/fuzz_check.h"
#include "operator/kube/selectors.h"

namespace {

using kt::kube::Object;
using Matcher = bool (*)(const Object&, const std::string&);

// nullopt when the selector is refused.
std::optional<bool> match(Matcher matcher, const Object& object, const std::string& selector) {
  try {
    return matcher(object, selector);
  } catch (const kt::kube::ApiError& e) {
    FUZZ_CHECK(e.code() == 400, e.what());
    return std::nullopt;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = kt::fuzz::split(kt::fuzz::as_text(data, size), '\0', 2);
  const std::string& selector = parts[0];
  Object object = Object::object();
  if (parts.size() > 1) {
    try {
      object = kt::api::parse_json(parts[1], "object.json");
    } catch (const kt::Error&) {
    }
  }
  for (Matcher matcher : {&kt::kube::matches_label_selector, &kt::kube::matches_field_selector}) {
    const auto on_object = match(matcher, object, selector);
    const auto on_empty = match(matcher, Object::object(), selector);
    FUZZ_CHECK(on_object.has_value() == on_empty.has_value(),
               "refusing \"" + selector + "\" depends on the object");
    // A single equality "k=v" against its negation "k!=v".
    const size_t eq = selector.find('=');
    if (on_object && eq != std::string::npos && eq > 0 &&
        selector.find_first_of(",!=()", eq + 1) == std::string::npos &&
        selector.find_first_of(",!()", 0) > eq) {
      const std::string negated = selector.substr(0, eq) + "!=" + selector.substr(eq + 1);
      const auto opposite = match(matcher, object, negated);
      FUZZ_CHECK(opposite && *opposite != *on_object, "\"" + selector + "\" vs \"" + negated + "\"");
    }
  }
  return 0;
}
