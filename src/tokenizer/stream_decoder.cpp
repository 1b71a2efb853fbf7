#include "tokenizer/stream_decoder.h"

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace dsinfer {

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string StreamDecoder::push(int32_t id) {
  if (skip_special_ && tokenizer_.is_special(id)) return {};
  pending_ += tokenizer_.token_bytes(id);
  // Everything but a tail that more bytes could still complete is final; ill-formed bytes in
  // it become U+FFFD exactly as the whole-text decoder would replace them.
  const size_t hold = tok::utf8_incomplete_tail_length(pending_);
  std::string out;
  tok::append_utf8_lossy(std::string_view(pending_).substr(0, pending_.size() - hold), out);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out = tok::utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace dsinfer
