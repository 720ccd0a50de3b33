#include "api/error.h"

#include <cstdio>
#include <cstdlib>

namespace kt {

FieldError::FieldError(std::string path, std::string problem)
    : Error(path + ": " + problem), path_(std::move(path)), problem_(std::move(problem)) {}

static std::string join_errors(const std::vector<FieldError>& errors) {
  std::string text;
  for (const auto& e : errors) {
    if (!text.empty()) text += "\n";
    text += e.what();
  }
  return text;
}

ValidationError::ValidationError(std::vector<FieldError> errors)
    : Error(join_errors(errors)), errors_(std::move(errors)) {}

void check_failed(const char* condition, const char* file, int line, const std::string& message) {
  std::fprintf(stderr, "kubetrain: internal error at %s:%d: check `%s` failed: %s\n", file, line,
               condition, message.c_str());
  std::abort();
}

}  // namespace kt
