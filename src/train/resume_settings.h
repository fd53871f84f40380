// What a resume may change of a mixture of experts: not the experts' count or width (the
// checkpoint's tensors have their shapes: refused, the setting named), but the routing
// (top-k, capacity, drop policy, scores), which takes effect from the resumed step.
#pragma once

#include <string>

#include "config/config.h"

namespace trident {

// UsageError "checkpoint DIR has model.n_experts=8, this run model.n_experts=4: ..." when the
// experts' shapes differ (the families' defaults resolved); otherwise the line that names
// the routing settings that changed, "" when none did.
std::string check_resumed_experts(const ModelConfig& checkpoint, const ModelConfig& now, const std::string& dir);

}  // namespace trident
