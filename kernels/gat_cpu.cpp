#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/gat.hpp"
#include "kernels/random.hpp"

namespace gale::kernels {

namespace {

// Dropout multiplier of attention entry `counter` (0 or 1 / (1 - p)).
inline float keep(float p, uint64_t key, uint64_t counter) {
  if (p <= 0.0f) return 1.0f;
  return random_uniform(key, counter) >= p ? 1.0f / (1.0f - p) : 0.0f;
}

inline float leaky(float x, float slope) { return x > 0.0f ? x : slope * x; }

template <typename Body>
void for_range(int64_t n, Body&& body) {
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, 64), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t i = r.begin(); i < r.end(); ++i) body(i);
  });
}

}  // namespace

void gat_scores_cpu(ConstMatrixView z, const GatShape& s, const float* att, int64_t rows, float* scores) {
  const int64_t H = s.heads, F = s.f;
  for_range(rows, [&](int64_t j) {
    const float* zj = z.row(j);
    for (int64_t h = 0; h < H; ++h) {
      float acc = 0.0f;
      for (int64_t k = 0; k < F; ++k) acc += zj[h * F + k] * att[h * F + k];
      scores[j * H + h] = acc;
    }
  });
}

void gat_scores_backward_cpu(ConstMatrixView z, const GatShape& s, const float* att, int64_t rows,
                             const float* grad_scores, MatrixView grad_z, float* grad_att) {
  const int64_t H = s.heads, F = s.f;
  for_range(rows, [&](int64_t j) {
    const float* gs = grad_scores + j * H;
    float* gz = grad_z.row(j);
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t k = 0; k < F; ++k) gz[h * F + k] += gs[h] * att[h * F + k];
    }
  });
  // grad_att: one task per column, summed over rows in order (deterministic), in double.
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, H * F, 1), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t c = r.begin(); c < r.end(); ++c) {
      const int64_t h = c / F;
      double acc = 0;
      for (int64_t j = 0; j < rows; ++j) acc += static_cast<double>(grad_scores[j * H + h] * z.row(j)[c]);
      grad_att[c] = static_cast<float>(grad_att[c] + acc);
    }
  });
}

void gat_softmax_cpu(const CsrView& g, const GatShape& s, const float* el, const float* er, float* alpha,
                     float* alpha_self) {
  const int64_t H = s.heads;
  for_range(g.rows, [&](int64_t i) {
    const int64_t b = g.indptr[i], e_end = g.indptr[i + 1];
    for (int64_t h = 0; h < H; ++h) {
      const float eri = er[i * H + h];
      float self = leaky(el[i * H + h] + eri, s.slope);
      float mx = self;
      for (int64_t e = b; e < e_end; ++e) {
        const float v = leaky(el[static_cast<int64_t>(g.indices[e]) * H + h] + eri, s.slope);
        alpha[e * H + h] = v;
        mx = std::max(mx, v);
      }
      double sum = std::exp(static_cast<double>(self - mx));
      for (int64_t e = b; e < e_end; ++e) sum += std::exp(static_cast<double>(alpha[e * H + h] - mx));
      const double inv = 1.0 / sum;
      for (int64_t e = b; e < e_end; ++e) alpha[e * H + h] = static_cast<float>(std::exp(static_cast<double>(alpha[e * H + h] - mx)) * inv);
      alpha_self[i * H + h] = static_cast<float>(std::exp(static_cast<double>(self - mx)) * inv);
    }
  });
}

void gat_aggregate_cpu(const CsrView& g, const GatShape& s, const float* alpha, const float* alpha_self, float p,
                       uint64_t key, ConstMatrixView z, MatrixView out) {
  const int64_t H = s.heads, F = s.f;
  const uint64_t nnz = static_cast<uint64_t>(g.nnz());
  for_range(g.rows, [&](int64_t i) {
    float* o = out.row(i);
    for (int64_t h = 0; h < H; ++h) {
      float* oh = o + h * F;
      const float a_self = alpha_self[i * H + h] * keep(p, key, (nnz + static_cast<uint64_t>(i)) * H + h);
      const float* zi = z.row(i) + h * F;
      for (int64_t k = 0; k < F; ++k) oh[k] = a_self * zi[k];
      for (int64_t e = g.indptr[i]; e < g.indptr[i + 1]; ++e) {
        const float a = alpha[e * H + h] * keep(p, key, static_cast<uint64_t>(e) * H + h);
        if (a == 0.0f) continue;
        const float* zj = z.row(g.indices[e]) + h * F;
        for (int64_t k = 0; k < F; ++k) oh[k] += a * zj[k];
      }
    }
  });
}

void gat_backward_cpu(const CsrView& g, const CsrView& csc, const int64_t* csc_edge, const GatShape& s,
                      const float* el, const float* er, const float* alpha, const float* alpha_self, float p,
                      uint64_t key, ConstMatrixView z, ConstMatrixView grad_out, MatrixView grad_z, float* grad_el,
                      float* grad_er) {
  const int64_t H = s.heads, F = s.f;
  const int64_t nnz = g.nnz();
  const uint64_t unnz = static_cast<uint64_t>(nnz);
  // Per-entry gradient of the pre-activation score, then reduced per destination (here) and per
  // source (over the transpose, below).
  std::vector<float> gpre(static_cast<size_t>(nnz * H)), gpre_self(static_cast<size_t>(g.rows * H));
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, g.rows, 64), [&](const tbb::blocked_range<int64_t>& range) {
    std::vector<float> ga;  // d loss / d alpha of one row's entries; reused across the range's rows
    for (int64_t i = range.begin(); i < range.end(); ++i) {
      const int64_t b = g.indptr[i], e_end = g.indptr[i + 1];
      const float* go = grad_out.row(i);
      ga.resize(static_cast<size_t>(e_end - b));
      for (int64_t h = 0; h < H; ++h) {
        const float* goh = go + h * F;
        auto dot = [&](int64_t src) {
          const float* zj = z.row(src) + h * F;
          float d = 0.0f;
          for (int64_t k = 0; k < F; ++k) d += goh[k] * zj[k];
          return d;
        };
        // d loss / d alpha (through dropout).
        const float ga_self = dot(i) * keep(p, key, (unnz + static_cast<uint64_t>(i)) * H + h);
        double weighted = static_cast<double>(alpha_self[i * H + h]) * ga_self;
        for (int64_t e = b; e < e_end; ++e) {
          const float m = keep(p, key, static_cast<uint64_t>(e) * H + h);
          ga[e - b] = m == 0.0f ? 0.0f : dot(g.indices[e]) * m;
          weighted += static_cast<double>(alpha[e * H + h]) * ga[e - b];
        }
        // Softmax backward, then LeakyReLU backward.
        const float eri = er[i * H + h];
        const float w = static_cast<float>(weighted);
        float sum_er = 0.0f;
        {
          const float gs = alpha_self[i * H + h] * (ga_self - w);
          const float gp = gs * (el[i * H + h] + eri > 0.0f ? 1.0f : s.slope);
          gpre_self[i * H + h] = gp;
          sum_er += gp;
        }
        for (int64_t e = b; e < e_end; ++e) {
          const float gs = alpha[e * H + h] * (ga[e - b] - w);
          const float gp = gs * (el[static_cast<int64_t>(g.indices[e]) * H + h] + eri > 0.0f ? 1.0f : s.slope);
          gpre[e * H + h] = gp;
          sum_er += gp;
        }
        grad_er[i * H + h] = sum_er;
      }
    }
  });
  // Per source j: gradient of its features through the aggregation, and of its score input el.
  for_range(csc.rows, [&](int64_t j) {
    float* gz = grad_z.row(j);
    const bool is_dst = j < g.rows;
    for (int64_t h = 0; h < H; ++h) {
      float* gzh = gz + h * F;
      float gel = 0.0f;
      if (is_dst) {
        const float a = alpha_self[j * H + h] * keep(p, key, (unnz + static_cast<uint64_t>(j)) * H + h);
        const float* go = grad_out.row(j) + h * F;
        for (int64_t k = 0; k < F; ++k) gzh[k] = a * go[k];
        gel += gpre_self[j * H + h];
      } else {
        for (int64_t k = 0; k < F; ++k) gzh[k] = 0.0f;
      }
      for (int64_t q = csc.indptr[j]; q < csc.indptr[j + 1]; ++q) {
        const int64_t e = csc_edge[q];
        const int64_t i = csc.indices[q];
        gel += gpre[e * H + h];
        const float a = alpha[e * H + h] * keep(p, key, static_cast<uint64_t>(e) * H + h);
        if (a == 0.0f) continue;
        const float* go = grad_out.row(i) + h * F;
        for (int64_t k = 0; k < F; ++k) gzh[k] += a * go[k];
      }
      grad_el[j * H + h] = gel;
    }
  });
}

}  // namespace gale::kernels
