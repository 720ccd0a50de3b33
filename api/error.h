// Errors of kubetrain: one style for the whole code base.
//  * kt::FieldError — bad user input at a field path ("spec.model.heads: 7 does not divide hidden
//    768"). Parsers and validators throw or collect these; the CLI prints them one per line.
//  * kt::Error      — any other failure a user can act on (a file that cannot be read, a plan that
//    fits nowhere). Its message is a complete sentence fragment without a trailing period.
//  * KT_CHECK       — internal invariants: a violated one is a bug and aborts loudly with context.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace kt {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// One problem at one field path. what() is "<path>: <problem>".
class FieldError : public Error {
 public:
  FieldError(std::string path, std::string problem);
  const std::string& path() const { return path_; }
  const std::string& problem() const { return problem_; }

 private:
  std::string path_;
  std::string problem_;
};

// Several field problems found at once (validation reports all of them, like the API server).
class ValidationError : public Error {
 public:
  explicit ValidationError(std::vector<FieldError> errors);
  const std::vector<FieldError>& errors() const { return errors_; }

 private:
  std::vector<FieldError> errors_;
};

[[noreturn]] void check_failed(const char* condition, const char* file, int line,
                               const std::string& message);

}  // namespace kt

#define KT_CHECK(cond, msg)                                            \
  do {                                                                 \
    if (!(cond)) ::kt::check_failed(#cond, __FILE__, __LINE__, (msg)); \
  } while (0)
