// ZeRO's stages (DeepSpeed's numbering): what data parallelism shards over its ranks,
// each stage sharding what the one before it does and more.
#pragma once

namespace trident {

enum class ZeroStage {
  none = 0,        // every rank holds everything
  optimizer = 1,   // ZeRO-1: the optimizer's state (and its update)
  gradients = 2,   // ZeRO-2, FSDP's SHARD_GRAD_OP: also the gradients
  parameters = 3,  // ZeRO-3, FSDP's FULL_SHARD: also the parameters
};

}  // namespace trident
