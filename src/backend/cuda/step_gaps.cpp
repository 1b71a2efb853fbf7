#include "backend/cuda/step_gaps.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"

namespace dsinfer::cuda {
namespace {

StepGapStats::Summary summarise(std::vector<float> gaps_us) {
  StepGapStats::Summary s;
  s.num_gaps = static_cast<int64_t>(gaps_us.size());
  if (gaps_us.empty()) return s;
  std::sort(gaps_us.begin(), gaps_us.end());
  for (float g : gaps_us) s.total_us += g;
  s.median_us = gaps_us[gaps_us.size() / 2];
  s.p99_us = gaps_us[std::min(gaps_us.size() - 1, gaps_us.size() * 99 / 100)];
  s.max_us = gaps_us.back();
  return s;
}

}  // namespace

StepGapTracker::StepGapTracker() : ring_(kRing) {
  for (Step& s : ring_) {
    DS_CUDA_CHECK(cudaEventCreate(&s.head));
    DS_CUDA_CHECK(cudaEventCreate(&s.tail));
  }
}

StepGapTracker::~StepGapTracker() {
  for (Step& s : ring_) {
    cudaEventDestroy(s.head);
    cudaEventDestroy(s.tail);
  }
}

void StepGapTracker::mark_head(Stream stream, bool decode_only) {
  const int i = static_cast<int>(num_steps_ % kRing);
  // Slot i's old step is the predecessor of the one in the next slot: read that gap before the
  // events are reused (both steps are long finished by now).
  const int next = (i + 1) % kRing;
  if (ring_[next].pending) resolve(next);
  Step& s = ring_[i];
  DS_CUDA_CHECK(cudaEventRecord(s.head, stream));
  s.decode_only = decode_only;
  s.has_tail = false;
  s.pending = num_steps_ > 0 && !drop_next_gap_;
  drop_next_gap_ = false;
  ++num_steps_;
}

void StepGapTracker::mark_tail(Stream stream) {
  if (num_steps_ == 0) return;
  Step& s = ring_[(num_steps_ - 1) % kRing];
  DS_CUDA_CHECK(cudaEventRecord(s.tail, stream));
  s.has_tail = true;
}

void StepGapTracker::resolve(int i) {
  Step& s = ring_[i];
  s.pending = false;
  const Step& before = ring_[(i + kRing - 1) % kRing];
  if (!before.has_tail) return;  // a step that enqueued nothing after its head: no gap to read
  DS_CUDA_CHECK(cudaEventSynchronize(s.head));
  float ms = 0.0f;
  DS_CUDA_CHECK(cudaEventElapsedTime(&ms, before.tail, s.head));
  const float us = std::max(0.0f, 1e3f * ms);
  gaps_us_.push_back(us);
  if (s.decode_only && before.decode_only) decode_gaps_us_.push_back(us);
}

StepGapStats StepGapTracker::take_stats() {
  // Oldest first: a step's predecessor must still hold its own events when it is read.
  const int64_t first = std::max<int64_t>(0, num_steps_ - kRing + 1);
  for (int64_t n = first; n < num_steps_; ++n) {
    const int i = static_cast<int>(n % kRing);
    if (ring_[i].pending) resolve(i);
  }
  StepGapStats stats{summarise(gaps_us_), summarise(decode_gaps_us_)};
  gaps_us_.clear();
  decode_gaps_us_.clear();
  drop_next_gap_ = true;
  return stats;
}

}  // namespace dsinfer::cuda
