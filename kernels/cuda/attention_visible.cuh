// Which keys a block of query rows sees, and which query rows see a block of keys, under
// the attention mask of kernels/attention_mask.h (key j visible to query i of sequence b
// iff doc_start[b, i] <= kv_pos[j] <= q_pos[i]): shared by the scalar and the tensor-core
// flash-attention kernels, which include it at their top (so inside their includer's
// namespace: attention.cu, attention_tensor_core.cu, or a CPU simulator test); it needs
// AttentionMask, int32_t and __device__ / __forceinline__ from there.
//
// Since q_pos and kv_pos increase and doc_start does not decrease along a sequence, one
// query row sees a contiguous index range of keys [first kv_pos >= doc_start, first
// kv_pos > q_pos), a run of rows sees at most the hull of their ranges (from the first
// row's document start to the last row's position), and the query rows that see a key
// form a range too. The kernels iterate only the tiles overlapping these ranges (whole
// tiles skipped: earlier documents and the causal future cost nothing) and mask single
// elements by the row's (or the key's) own range.

// An index range [begin, end), end >= begin.
struct IndexRange {
  int begin, end;
};

// The first index of pos[0, n) (increasing) with pos >= value (n if none).
__device__ __forceinline__ int first_at_least(const int32_t* pos, int n, int32_t value) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (pos[mid] < value) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// The first index of pos[0, n) (nondecreasing) with pos > value (n if none).
__device__ __forceinline__ int first_above(const int32_t* pos, int n, int32_t value) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (pos[mid] <= value) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// The keys that query rows [first, last] of sequence b may see: exactly row first's
// keys when first == last, the hull of the rows' ranges otherwise; empty when first >
// last (no such rows).
__device__ __forceinline__ IndexRange visible_keys(const AttentionMask& mask, int b, int Tq, int Tk, int first,
                                                   int last) {
  if (first > last) return {0, 0};
  const int begin = mask.doc_start != nullptr
                        ? first_at_least(mask.kv_pos, Tk, mask.doc_start[static_cast<size_t>(b) * Tq + first])
                        : 0;
  const int end = first_above(mask.kv_pos, Tk, mask.q_pos[last]);
  return {begin, end > begin ? end : begin};
}

// The query rows of sequence b that may see keys [first, last]: exactly those that see
// key first when first == last, a superset (the hull) otherwise; empty when first > last.
__device__ __forceinline__ IndexRange seeing_queries(const AttentionMask& mask, int b, int Tq, int first, int last) {
  if (first > last) return {0, 0};
  const int begin = first_at_least(mask.q_pos, Tq, mask.kv_pos[first]);
  const int end = mask.doc_start != nullptr
                      ? first_above(mask.doc_start + static_cast<size_t>(b) * Tq, Tq, mask.kv_pos[last])
                      : Tq;
  return {begin, end > begin ? end : begin};
}


// Counts the work of the kernels in the CPU simulator's tests (each (query tile, key
// tile) pair a block loads, and each one a warp computes); nothing on a GPU.
#ifndef TRIDENT_ATTENTION_COUNT_TILE
#define TRIDENT_ATTENTION_COUNT_TILE()
#endif
#ifndef TRIDENT_ATTENTION_COUNT_WARP_TILE
#define TRIDENT_ATTENTION_COUNT_WARP_TILE()
#endif

// The shapes of one attention call (kernels/ops.def): Tq query rows (q in qkv's rows of
// (NH + 2 NKV) hd), Tk key rows (k and v in kv's rows of kv_ld: key/value head g's k at
// column g hd, its v at (NKV + g) hd).
struct AttentionDims {
  int Tq, Tk, NH, NKV, hd, kv_ld;
  __device__ __forceinline__ size_t q_ld() const { return static_cast<size_t>(NH + 2 * NKV) * hd; }
  __device__ __forceinline__ size_t out_ld() const { return static_cast<size_t>(NH) * hd; }
  __device__ __forceinline__ int group() const { return NH / NKV; }
};
