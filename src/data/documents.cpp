#include "data/documents.h"

#include <glob.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/indexed_dataset.h"
#include "kernels/base/error.h"

namespace fs = std::filesystem;

namespace trident {

namespace {

InputFile input_of(const fs::path& p) {
  InputFile f;
  f.path = p.string();
  f.bytes = fs::file_size(p);
  std::string name = p.filename().string();
  if (name.ends_with(".gz")) {
    f.gzip = true;
    name.resize(name.size() - 3);
  }
  f.jsonl = name.ends_with(".jsonl") || name.ends_with(".json");
  return f;
}

void add_folder(const fs::path& dir, std::vector<InputFile>& out) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string(), ext = e.path().extension().string();
    if (e.is_regular_file() && ext != ".dat" && ext != ".u8" && !name.starts_with(".")) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) out.push_back(input_of(f));
}

// One text document's end: the next line holding only '%' (or the end).
// Documents are the text between such lines; returns the start of the next document.
struct TextCursor {
  std::string_view text;
  size_t at = 0;
  // The first document start at or after `from`: 0, or just after a '%' line.
  static size_t first_start_at_or_after(std::string_view t, size_t from) {
    if (from == 0) return 0;
    for (size_t p = from; p <= t.size(); p++) {
      // A '%' line ends right before p: "...\n%\n" or "%\n" at the start.
      if (p >= 2 && t[p - 1] == '\n' && t[p - 2] == '%' && (p == 2 || t[p - 3] == '\n')) return p;
    }
    return t.size();
  }
  // The document starting at `at` ends at the next '%' line; *next = after that line.
  static size_t document_end(std::string_view t, size_t at, size_t* next) {
    size_t line = at;
    while (line < t.size()) {
      const size_t nl = t.find('\n', line);
      const size_t end = nl == std::string_view::npos ? t.size() : nl;
      if (end - line == 1 && t[line] == '%') {
        *next = nl == std::string_view::npos ? t.size() : nl + 1;
        return line;
      }
      if (nl == std::string_view::npos) break;
      line = nl + 1;
    }
    *next = t.size();
    return t.size();
  }
};

std::string_view json_document(std::string_view line, const std::string& key, const std::string& file, size_t line_no,
                               std::string& storage) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(file + ": line " + std::to_string(line_no) + " is not JSON (" + e.what() + ")");
  }
  require(j.is_object() && j.contains(key) && j[key].is_string(),
          file + ": line " + std::to_string(line_no) + " has no string \"" + key + "\" (--json_key)");
  storage = j[key].get<std::string>();
  return storage;
}

// The documents of one decoded text that start in [begin, end) of it.
void documents_of(std::string_view t, const InputFile& in, size_t begin, size_t end, const std::string& key,
                  const std::function<void(std::string_view)>& f, size_t first_line) {
  std::string storage;
  if (in.jsonl) {
    size_t at = begin == 0 ? 0 : t.find('\n', begin - 1);
    if (at == std::string_view::npos) return;
    if (begin > 0) at++;  // just after a newline
    size_t line_no = first_line + static_cast<size_t>(std::count(t.begin(), t.begin() + at, '\n'));
    while (at < end && at < t.size()) {
      size_t nl = t.find('\n', at);
      if (nl == std::string_view::npos) nl = t.size();
      std::string_view line = t.substr(at, nl - at);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.find_first_not_of(" \t") != std::string_view::npos) {
        const std::string_view doc = json_document(line, key, in.path, line_no + 1, storage);
        if (!doc.empty()) f(doc);
      }
      line_no++;
      at = nl + 1;
    }
    return;
  }
  for (size_t at = TextCursor::first_start_at_or_after(t, begin); at < end && at < t.size();) {
    size_t next = 0;
    const size_t stop = TextCursor::document_end(t, at, &next);
    if (stop > at) f(t.substr(at, stop - at));
    at = next;
  }
}

std::string gunzip(const std::string& path) {
  gzFile g = gzopen(path.c_str(), "rb");
  require(g != nullptr, "cannot open '" + path + "'");
  std::string out;
  std::vector<char> buf(1 << 20);
  while (true) {
    const int n = gzread(g, buf.data(), static_cast<unsigned>(buf.size()));
    if (n < 0) {
      int code = 0;
      const std::string message = gzerror(g, &code);
      gzclose(g);
      throw UsageError(path + ": not a readable gzip file (" + message + ") after " + std::to_string(out.size()) +
                       " decompressed bytes");
    }
    if (n == 0) break;
    out.append(buf.data(), n);
  }
  const int rc = gzclose(g);
  require(rc == Z_OK, path + ": the gzip stream is truncated or damaged");
  return out;
}

}  // namespace

std::vector<InputFile> list_inputs(const std::vector<std::string>& paths) {
  std::vector<InputFile> out;
  for (const std::string& p : paths) {
    if (p.find_first_of("*?[") != std::string::npos) {
      glob_t g{};
      std::vector<std::string> matches;
      if (::glob(p.c_str(), 0, nullptr, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; i++) matches.emplace_back(g.gl_pathv[i]);
      globfree(&g);
      require(!matches.empty(), "--input '" + p + "' matches no file");
      std::sort(matches.begin(), matches.end());
      for (const std::string& m : matches) fs::is_directory(m) ? add_folder(m, out) : out.push_back(input_of(m));
    } else {
      require(fs::exists(p), "--input '" + p + "' does not exist");
      fs::is_directory(p) ? add_folder(p, out) : out.push_back(input_of(p));
    }
  }
  require(!out.empty(), "no input files");
  return out;
}

uint64_t total_bytes(const std::vector<InputFile>& inputs) {
  uint64_t n = 0;
  for (const InputFile& f : inputs) n += f.bytes;
  return n;
}

void for_each_document(const std::vector<InputFile>& inputs, uint64_t begin, uint64_t end, const std::string& json_key,
                       const std::function<void(std::string_view document)>& f,
                       const std::function<void(uint64_t bytes)>& progress) {
  uint64_t offset = 0, consumed = 0;
  for (const InputFile& in : inputs) {
    const uint64_t first = offset, last = offset + in.bytes;
    offset = last;
    if (in.gzip) {  // whole, to the rank of its first byte
      if (first < begin || first >= end) continue;
      const std::string text = gunzip(in.path);
      documents_of(text, in, 0, text.size(), json_key, f, 0);
    } else {
      if (last <= begin || first >= end || in.bytes == 0) continue;
      const MappedFile map(in.path);
      const std::string_view text(reinterpret_cast<const char*>(map.data()), map.size());
      const size_t from = static_cast<size_t>(std::max(begin, first) - first);
      const size_t to = static_cast<size_t>(std::min(end, last) - first);
      documents_of(text, in, from, to, json_key, f, 0);
    }
    consumed += std::min(end, last) - std::max(begin, first);
    if (progress) progress(consumed);
  }
}

}  // namespace trident
