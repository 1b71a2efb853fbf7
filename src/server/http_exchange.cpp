// HttpRequest helpers.
#include "server/http_exchange.h"

#include <strings.h>

namespace dsinfer::server {

std::string HttpRequest::path() const {
  size_t q = target.find('?');
  return q == std::string::npos ? target : target.substr(0, q);
}

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k.size() == name.size() && strncasecmp(k.data(), name.data(), name.size()) == 0) return v;
  }
  return "";
}

}  // namespace dsinfer::server
