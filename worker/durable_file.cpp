// Durable files: checked system calls, fsync, atomic replacement (worker/durable_file.h).
#include "worker/durable_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>

namespace kt::worker {

namespace fs = std::filesystem;

void throw_io_error(const std::string& action, const std::string& path, int err) {
  throw IoError("cannot " + action + " " + path + ": " + std::strerror(err), err);
}

CheckedFile::CheckedFile(std::string path, int flags, mode_t mode) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), flags | O_CLOEXEC, mode);
  if (fd_ < 0) throw_io_error("open", path_);
}

CheckedFile::~CheckedFile() {
  if (fd_ >= 0) ::close(fd_);
}

void CheckedFile::write_all(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_io_error("write", path_);
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

bool CheckedFile::read_exact(void* data, size_t bytes) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::read(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_io_error("read", path_);
    if (n == 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

uint64_t CheckedFile::size() const {
  struct stat st;
  if (::fstat(fd_, &st) != 0) throw_io_error("stat", path_);
  return static_cast<uint64_t>(st.st_size);
}

void CheckedFile::sync() {
  if (::fsync(fd_) != 0) throw_io_error("fsync", path_);
}

void CheckedFile::close() {
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw_io_error("close", path_);
}

void sync_dir(const std::string& path) {
  CheckedFile(path, O_RDONLY | O_DIRECTORY).sync();
}

void write_file_synced(const std::string& path, const std::string& content) {
  CheckedFile file(path, O_WRONLY | O_CREAT | O_TRUNC);
  file.write_all(content.data(), content.size());
  file.sync();
  file.close();
}

void rename_path(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) throw_io_error("rename " + from + " to", to);
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) {
    std::fprintf(stderr, "kubetrain-worker: cannot remove %s: %s\n", path.c_str(),
                 ec.message().c_str());
  }
}

bool path_exists(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) return true;
  if (errno != ENOENT) throw_io_error("stat", path);
  return false;
}

void replace_file_atomically(const std::string& path,
                             const std::function<void(CheckedFile&)>& write) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  try {
    CheckedFile file(tmp, O_WRONLY | O_CREAT | O_TRUNC);
    write(file);
    file.sync();
    file.close();
    rename_path(tmp, path);
  } catch (const Error&) {
    ::unlink(tmp.c_str());
    throw;
  }
  const std::string parent = fs::path(path).parent_path().string();
  sync_dir(parent.empty() ? "." : parent);
}

}  // namespace kt::worker
