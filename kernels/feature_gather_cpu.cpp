#include <tbb/parallel_for.h>

#include <atomic>
#include <cstring>

#include "kernels/feature_gather.hpp"

namespace gale::kernels {

void tiered_gather_cpu(const TieredGatherArgs& a) {
  std::atomic<int64_t> counts[kFeatureTiers] = {};
  const size_t row_bytes = static_cast<size_t>(a.out.cols) * sizeof(float);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, a.n, 1024), [&](const tbb::blocked_range<int64_t>& r) {
    int64_t local[kFeatureTiers] = {};
    for (int64_t i = r.begin(); i < r.end(); ++i) {
      const int64_t id = a.ids[i];
      const float* src;
      if (a.prev_rows && a.prev_rows[i] >= 0) {
        src = a.prev.row(a.prev_rows[i]);
        ++local[kTierPrevious];
      } else if (a.device.data) {
        src = a.device.row(id);
        ++local[kTierDevice];
      } else if (a.cache_slot && a.cache_slot[id] >= 0) {
        src = a.cache.row(a.cache_slot[id]);
        ++local[kTierCache];
      } else {
        src = a.host.row(a.host_rows ? a.host_rows[i] : id);
        ++local[kTierHost];
      }
      std::memcpy(a.out.row(i), src, row_bytes);
    }
    for (int t = 0; t < kFeatureTiers; ++t) counts[t] += local[t];
  });
  if (a.counters)
    for (int t = 0; t < kFeatureTiers; ++t) a.counters[t] += counts[t].load();
}

void match_rows_cpu(const int32_t* row_of, const int64_t* ids, int64_t n, int32_t* rows) {
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, 16384), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t i = r.begin(); i < r.end(); ++i) rows[i] = row_of[ids[i]];
  });
}

void match_advance_cpu(int32_t* row_of, const int64_t* prev_ids, int64_t prev_n, const int64_t* ids, int64_t n) {
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, prev_n, 16384), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t i = r.begin(); i < r.end(); ++i) row_of[prev_ids[i]] = -1;
  });
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, 16384), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t i = r.begin(); i < r.end(); ++i) row_of[ids[i]] = static_cast<int32_t>(i);
  });
}

int64_t uncached_ids_cpu(const int32_t* cache_slot, const int64_t* ids, int64_t n, int64_t* out) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i)
    if (cache_slot[ids[i]] < 0) out[count++] = ids[i];
  return count;
}

}  // namespace gale::kernels
