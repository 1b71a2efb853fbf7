// How long the device sits idle between consecutive steps: the time from the end of one step's
// work on the stream to the start of the next step's, which is zero whenever the host enqueued
// the next step before the device finished the last one (asynchronous scheduling's promise).
// Two timing events per step, resolved lazily; no host waits while steps run.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_kernels.h"

struct CUevent_st;

namespace dsinfer::cuda {

class StepGapTracker {
 public:
  StepGapTracker();
  ~StepGapTracker();
  StepGapTracker(const StepGapTracker&) = delete;
  StepGapTracker& operator=(const StepGapTracker&) = delete;

  // The next step's first work is about to be enqueued on `stream`. decode_only: every token
  // of the step is a sequence's single new token.
  void mark_head(Stream stream, bool decode_only);
  // The current step's work so far is enqueued (the last call before the next head counts).
  void mark_tail(Stream stream);
  // The gaps since the last call (waits for the events still outstanding); the next step's gap
  // to the last one before this call is not counted either.
  StepGapStats take_stats();

 private:
  struct Step {
    CUevent_st* head = nullptr;
    CUevent_st* tail = nullptr;
    bool decode_only = false;
    bool has_tail = false;
    bool pending = false;  // its gap to the step before it is not yet read
  };
  // Reads step i's gap to step i - 1 (both in the ring) into the lists.
  void resolve(int i);

  static constexpr int kRing = 256;
  std::vector<Step> ring_;
  int64_t num_steps_ = 0;
  bool drop_next_gap_ = false;
  std::vector<float> gaps_us_, decode_gaps_us_;
};

}  // namespace dsinfer::cuda
