#include "codec/logprobs_json.h"

namespace dsinfer::codec {

using nlohmann::json;

namespace {

json bytes_json(const std::string& bytes) {
  json list = json::array();
  for (unsigned char b : bytes) list.push_back(static_cast<int>(b));
  return list;
}

json token_json(const LogprobToken& token) {
  return {{"token", token.text}, {"logprob", reported_logprob(token.logprob)}, {"bytes", bytes_json(token.bytes)}};
}

}  // namespace

json openai_logprob_json(const TokenLogprobs& token) {
  json entry = token_json(token.chosen);
  json top = json::array();
  for (const LogprobToken& alt : token.top) top.push_back(token_json(alt));
  entry["top_logprobs"] = std::move(top);
  return entry;
}

}  // namespace dsinfer::codec
