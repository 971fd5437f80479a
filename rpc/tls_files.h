// TlsFiles: where the PEM files for TLS are. A plain value type with no gRPC
// in it, so headers that only carry options (and may be included next to
// LibTorch, which ships its own protobuf headers) stay free of gRPC.
#ifndef MUSTER_RPC_TLS_FILES_H_
#define MUSTER_RPC_TLS_FILES_H_

#include <string>

namespace muster {

// PEM files for TLS. All empty: plain text. cert+key: TLS; with ca as well:
// the server requires and verifies client certificates (mutual TLS), and a
// client presents cert+key and verifies the server against ca.
struct TlsFiles {
  std::string cert;
  std::string key;
  std::string ca;
  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

}  // namespace muster

#endif  // MUSTER_RPC_TLS_FILES_H_
