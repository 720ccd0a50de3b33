// Durable files: system calls on files and directories that are checked (a failure throws
// IoError naming the path and the errno), fsync of files and of the directories that hold them,
// and replacing a file atomically (write a temp file, fsync, rename, fsync the parent), so that a
// crash at any instant leaves either the old content or the new. Checkpoints (worker/checkpoint.h)
// and llm.c model files (worker/llmc_file.h) are written through these.
#pragma once

#include <sys/types.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "api/error.h"

namespace kt::worker {

// A system call on a file failed; err() is its errno (ENOSPC: disk full, EROFS: read-only,
// EACCES: no permission, ...).
class IoError : public Error {
 public:
  IoError(const std::string& message, int err) : Error(message), err_(err) {}
  int err() const { return err_; }

 private:
  int err_;
};

// Throws IoError "cannot <action> <path>: <strerror(err)>".
[[noreturn]] void throw_io_error(const std::string& action, const std::string& path,
                                 int err = errno);

// An open file descriptor whose every call is checked; closed when the object goes.
class CheckedFile {
 public:
  // open(2) with O_CLOEXEC added.
  CheckedFile(std::string path, int flags, mode_t mode = 0644);
  ~CheckedFile();
  CheckedFile(const CheckedFile&) = delete;
  CheckedFile& operator=(const CheckedFile&) = delete;

  void write_all(const void* data, size_t bytes);
  // Reads exactly `bytes`; false when the file ends first.
  bool read_exact(void* data, size_t bytes);
  uint64_t size() const;
  void sync();
  // close(2) can report a failed delayed write: check it when writing.
  void close();

 private:
  std::string path_;
  int fd_ = -1;
};

// fsync of a directory: without it, a crash can lose a rename or a newly created file even after
// the file's own fsync.
void sync_dir(const std::string& path);

// Creates or truncates `path`, writes `content`, fsyncs and closes it (the directory entry is
// the caller's to sync).
void write_file_synced(const std::string& path, const std::string& content);

// rename(2); throws IoError naming both paths.
void rename_path(const std::string& from, const std::string& to);

// Removes a file or directory tree, best effort: a failure prints one line on stderr (a leftover
// is harmless where the next save removes it).
void remove_tree(const std::string& path);

// Whether `path` exists (lstat: a dangling symlink exists); throws IoError for errors other than
// ENOENT.
bool path_exists(const std::string& path);

// Replaces `path` atomically: `write` fills `<path>.tmp-<pid>`, which is fsync'd, closed and
// renamed over `path`, and then the parent directory is fsync'd. On a failure the temp file is
// removed and `path` is untouched.
void replace_file_atomically(const std::string& path,
                             const std::function<void(CheckedFile&)>& write);

}  // namespace kt::worker
