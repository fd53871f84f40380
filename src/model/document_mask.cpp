#include "model/document_mask.h"

#include <cstddef>

namespace trident {

void document_starts(const int32_t* tokens, int B, int T, int32_t eod, int32_t* starts) {
  for (int b = 0; b < B; b++) {
    const int32_t* row = tokens + static_cast<size_t>(b) * T;
    int32_t* out = starts + static_cast<size_t>(b) * T;
    int32_t start = 0;
    for (int i = 0; i < T; i++) {
      out[i] = start;
      if (row[i] == eod) start = i + 1;  // the next token opens the next document
    }
  }
}

void narrow_to_window(int32_t* starts, int B, int T, int window) {
  for (int b = 0; b < B; b++)
    for (int i = window; i < T; i++) {
      int32_t& start = starts[static_cast<size_t>(b) * T + i];
      if (start < i - window + 1) start = i - window + 1;
    }
}

}  // namespace trident
