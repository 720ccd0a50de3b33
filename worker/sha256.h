// SHA-256 of a stream of bytes, through OpenSSL's libcrypto (EVP_sha256): the checksum of every
// checkpoint shard (docs/CHECKPOINTS.md, "Checksum"), hashed while the shard is written or read.
#pragma once

#include <cstddef>
#include <string>

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX

namespace kt::worker {

class Sha256 {
 public:
  Sha256();  // throws kt::Error when OpenSSL cannot set up the digest
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void update(const void* data, size_t bytes);
  // The digest of everything passed to update(), as 64 lowercase hex digits (what sha256sum
  // prints). Call it once.
  std::string hex_digest();

 private:
  evp_md_ctx_st* ctx_;
};

}  // namespace kt::worker
