// Building ForwardBatch values by hand for model-level tests.
#pragma once

#include <vector>

#include "backend/backend.h"

namespace dsinfer::testing {

// One sequence whose tokens [start, tokens.size()) are new this step, in blocks of block_size
// tokens laid out in reverse order (block table num_blocks-1 … 0), logits at its last token.
inline ForwardBatch single_sequence_batch(const std::vector<TokenId>& tokens, int start, int num_blocks,
                                          int block_size = 64) {
  ForwardBatch b;
  b.num_tokens = static_cast<int>(tokens.size()) - start;
  std::vector<int32_t> table(num_blocks);
  for (int i = 0; i < num_blocks; ++i) table[i] = num_blocks - 1 - i;  // non-trivial block order
  for (int i = start; i < static_cast<int>(tokens.size()); ++i) {
    b.token_ids.push_back(tokens[i]);
    b.positions.push_back(i);
    b.slot_mapping.push_back(table[i / block_size] * block_size + i % block_size);
    b.token_seq.push_back(0);
  }
  b.block_tables.push_back(table);
  b.context_lens.push_back(static_cast<int32_t>(tokens.size()));
  b.logits_indices.push_back(b.num_tokens - 1);
  return b;
}

}  // namespace dsinfer::testing
