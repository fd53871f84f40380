#include "plan/schedule_time.h"

#include <algorithm>

namespace trident {

double pipeline_bubble(Schedule schedule, int stages, int chunks, const PassTimes& t) {
  const int idle = stages - 1;
  switch (schedule) {
    case Schedule::one_f_one_b:
    case Schedule::gpipe:
      return idle * t.total();
    case Schedule::interleaved:
      return idle * t.total() / chunks;
    case Schedule::zb1:
      return idle * std::max({t.forward, t.input_gradient, t.forward + t.input_gradient - t.weight_gradient});
  }
  return idle * t.total();
}

int critical_path_transfers(Schedule schedule, int stages, int chunks) {
  return 2 * (stages - 1) * (schedule == Schedule::interleaved ? chunks : 1);
}

}  // namespace trident
