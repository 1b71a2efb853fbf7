// Building ForwardBatch values by hand for model-level tests.
#pragma once

#include <functional>
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

// Appends one sequence whose tokens at positions [first_pos, first_pos + count) are new this
// step (ids from token_of(pos)), with its block table and its logits at its last token.
inline void append_sequence(ForwardBatch& b, const std::vector<int32_t>& table, int first_pos, int count,
                            const std::function<TokenId(int pos)>& token_of, int block_size = 64) {
  const auto seq = static_cast<int32_t>(b.block_tables.size());
  for (int p = first_pos; p < first_pos + count; ++p) {
    b.token_ids.push_back(token_of(p));
    b.positions.push_back(p);
    b.slot_mapping.push_back(table[p / block_size] * block_size + p % block_size);
    b.token_seq.push_back(seq);
  }
  b.block_tables.push_back(table);
  b.context_lens.push_back(first_pos + count);
  b.logits_indices.push_back(static_cast<int32_t>(b.token_ids.size()) - 1);
  b.num_tokens = static_cast<int>(b.token_ids.size());
}

}  // namespace dsinfer::testing
