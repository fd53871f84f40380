// Document masking (data.document_mask): documents packed into one sequence attend only
// within themselves, as Llama 3 trained. A document ends with the end-of-document token,
// which belongs to the document it ends; positions stay those of the sequence (no reset
// at a document's start). The attention kernels take the mask as each query's document
// start (kernels/attention_mask.h), never as T x T; a sliding window narrows the same
// starts.
#pragma once

#include <cstdint>

namespace trident {

// starts[b*T + i] = the position where the document holding token i of row b begins: one
// past the last `eod` strictly before i in the row, or 0.
void document_starts(const int32_t* tokens, int B, int T, int32_t eod, int32_t* starts);

// Sliding-window attention (Mistral) in the same terms: token i sees no key before
// i - window + 1, so its first visible position is the later of that and its document's
// start (starts holds those, or zeros without documents).
void narrow_to_window(int32_t* starts, int B, int T, int window);

}  // namespace trident
