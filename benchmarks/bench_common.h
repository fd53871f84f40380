// What the benchmarks' command lines and tables share.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace trident::bench {

// "4096,8192" -> {4096, 8192} (a --T= list).
inline std::vector<int> parse_int_list(const char* text) {
  std::vector<int> values;
  for (const char* p = text; *p != '\0';) {
    values.push_back(std::atoi(p));
    p = std::strchr(p, ',');
    if (p == nullptr) break;
    p++;
  }
  return values;
}

// The machine's load (another job on the cores shows here): /proc/loadavg's first three.
inline std::string load_average() {
  char text[64] = {};
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fgets(text, sizeof text, f) == nullptr) text[0] = '\0';
    std::fclose(f);
  }
  std::string s(text);
  for (int spaces = 0, i = 0; i < static_cast<int>(s.size()); i++)
    if (s[i] == ' ' && ++spaces == 3) return s.substr(0, i);
  return s;
}

}  // namespace trident::bench
