// Incremental detokenizer: ids in, text out as soon as it is complete UTF-8. The
// concatenation of every push() and finish() equals Tokenizer::decode of all the ids.
#pragma once

#include <cstdint>
#include <string>

namespace dsinfer {

class Tokenizer;

class StreamDecoder {
 public:
  // skip_special leaves special tokens (e.g. <｜end▁of▁sentence｜>) out of the text.
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special = true);

  // The text that id completes: never part of a UTF-8 sequence. Bytes that can no longer
  // become valid UTF-8 come out as U+FFFD at once; a sequence that may still complete is held.
  std::string push(int32_t id);
  // Flushes what is held: a sequence that never completed becomes U+FFFD.
  std::string finish();

  // Bytes held back waiting for the rest of a character (0..3).
  size_t num_pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace dsinfer
