// Client: the public face of a session (ClientImpl).
#include "collectived/client.h"

#include <memory>
#include <string>

#include "client/src/session.h"

namespace collectived {

Client::Client(std::shared_ptr<ClientImpl> impl) : impl_(std::move(impl)) {}
// Meshes may still hold the implementation: the session ends now all the
// same.
Client::~Client() { impl_->Close(); }

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(ClientOptions options) {
  auto impl = std::make_shared<ClientImpl>(std::move(options));
  if (absl::Status st = impl->Connect(); !st.ok()) return st;
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<Mesh>> Client::JoinMesh(const MeshOptions& options) {
  return impl_->JoinMesh(options);
}
absl::StatusOr<Buffer> Client::Allocate(size_t bytes) { return impl_->Allocate(bytes, ""); }
absl::StatusOr<Buffer> Client::Allocate(size_t bytes, std::string_view device) {
  return impl_->Allocate(bytes, device);
}
absl::Status Client::Free(Buffer& buffer) { return impl_->Free(buffer); }
const std::string& Client::session_id() const { return impl_->session_id(); }
const std::string& Client::socket_path() const { return impl_->socket_path(); }
bool Client::fast_path() const { return impl_->fast_path(); }

}  // namespace collectived
