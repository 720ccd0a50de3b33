// SHA-256 through OpenSSL's libcrypto (worker/sha256.h).
#include "worker/sha256.h"

#include <openssl/evp.h>

#include "api/error.h"

namespace kt::worker {

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_ || EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1) {
    EVP_MD_CTX_free(ctx_);
    throw Error("cannot initialise SHA-256 (OpenSSL)");
  }
}

Sha256::~Sha256() {
  EVP_MD_CTX_free(ctx_);
}

void Sha256::update(const void* data, size_t bytes) {
  if (EVP_DigestUpdate(ctx_, data, bytes) != 1) throw Error("SHA-256 (OpenSSL) failed");
}

std::string Sha256::hex_digest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_DigestFinal_ex(ctx_, digest, &length) != 1) throw Error("SHA-256 (OpenSSL) failed");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) {
    hex += kHex[digest[i] >> 4];
    hex += kHex[digest[i] & 15];
  }
  return hex;
}

}  // namespace kt::worker
